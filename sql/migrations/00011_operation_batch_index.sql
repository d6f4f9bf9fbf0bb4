-- +goose Up
-- batcherd schema v11: operation loses idx_batch (batch_id), as merge_batch_request lost
-- its own in v3. No query finds operations by batch_id alone: a batch's members are read
-- through merge_batch_member, and the settle's guarded reads and writes name each member
-- (operation_id IN (…) AND batch_id = ?, served by uk_operation_id). The index only cost
-- writes: the claim sets batch_id on every member's operation and a requeue clears it,
-- each moving an entry of it (about a sixth of a claim's server time; BENCHMARKS.md,
-- section 3). Dropping a secondary index is an in-place, metadata-only change in InnoDB,
-- instant on a populated table; binaries older than v11 answer the same without it.

-- +goose StatementBegin
ALTER TABLE operation DROP KEY idx_batch;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE operation ADD KEY idx_batch (batch_id);
-- +goose StatementEnd
