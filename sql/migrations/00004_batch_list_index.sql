-- +goose Up
-- batcherd schema v4: merge_batch gains idx_repo_id (repo, id) for GET /v1/batches?repo=,
-- newest first. idx_repo_status (repo, status, id) serves a repository with a status,
-- but not a repository alone in id order: the optimizer then walked the primary key
-- backwards past every other repository's newer batches, 0.2 s per 700k batches for a
-- repository that had gone quiet, growing with history. A few index writes per batch.
-- Adding a secondary index is an online, in-place change in InnoDB; binaries older than
-- v4 ignore the index, newer ones answer correctly (if slower) without it.

-- +goose StatementBegin
ALTER TABLE merge_batch ADD KEY idx_repo_id (repo, id);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE merge_batch DROP KEY idx_repo_id;
-- +goose StatementEnd
