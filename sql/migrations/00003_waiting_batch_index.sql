-- +goose Up
-- batcherd schema v3: merge_batch_request loses idx_batch (batch_id). Every lookup of a
-- batch's waiting rows knows the batch's repository and uses idx_repo_waiting's
-- (repo, batch_id) prefix instead, so the index only cost writes: a claim moved three
-- secondary entries per waiting row, now two (measured in BENCHMARKS.md, section 3).
-- Dropping a secondary index is an in-place, metadata-only change in InnoDB.

-- +goose StatementBegin
ALTER TABLE merge_batch_request DROP KEY idx_batch;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE merge_batch_request ADD KEY idx_batch (batch_id);
-- +goose StatementEnd
