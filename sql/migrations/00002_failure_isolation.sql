-- +goose Up
-- batcherd schema v2: failure isolation (issue #9). A failed batch's members go back to
-- the waiting set in claim groups (a retry of the same members, or one half of a
-- bisection); the claim takes the group of the oldest waiting row only. Groups are plain
-- columns written by the same guarded, affected-rows-checked statements as the rest of
-- the waiting set, so the invariants of v1 (I1-I4) hold unchanged. store.CheckSchema
-- verifies the new index (I8).

-- +goose StatementBegin
ALTER TABLE merge_batch_request
  ADD COLUMN grp       VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'claim group: empty = ordinary queue; b<batch>.r = retry of failed batch <batch>; b<batch>.<k> = half k of its bisection',
  ADD COLUMN kind      VARCHAR(32) NOT NULL DEFAULT 'first_try' COMMENT 'why the row waits: first_try, retry_<class>, bisect',
  ADD COLUMN parent_id BIGINT      NULL COMMENT 'the failed batch this group comes from',
  ADD COLUMN depth     INT         NOT NULL DEFAULT 0 COMMENT 'bisection depth: 0 = never bisected',
  ADD COLUMN half      TINYINT     NOT NULL DEFAULT 0 COMMENT 'bisect: 1 or 2; 0 otherwise',
  ADD COLUMN retries   INT         NOT NULL DEFAULT 0 COMMENT 'consecutive retries of this group (bisection resets it)',
  ADD COLUMN tries     INT         NOT NULL DEFAULT 0 COMMENT 'charged attempts since admission (first try and retries; bisection rounds are free), bounded by MAX_ATTEMPTS',
  -- "waiting rows of one group of a repository, oldest first"
  ADD KEY idx_repo_group_waiting (repo, batch_id, grp, created_at, id);
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE merge_batch
  ADD COLUMN kind       VARCHAR(32) NOT NULL DEFAULT 'first_try' COMMENT 'first_try, retry_<class>, bisect: the kind of the group claimed',
  ADD COLUMN grp        VARCHAR(64) NOT NULL DEFAULT '' COMMENT 'the claim group this batch took',
  ADD COLUMN parent_id  BIGINT      NULL COMMENT 'the failed batch whose retry or bisection half this is',
  ADD COLUMN depth      INT         NOT NULL DEFAULT 0 COMMENT 'bisection depth',
  ADD COLUMN fail_class VARCHAR(32) NOT NULL DEFAULT '' COMMENT 'failure class batcherd is settling; written before batcherd closes the MR, so a closed MR without it was closed by a human';
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE merge_batch_member
  ADD COLUMN why VARCHAR(255) NOT NULL DEFAULT '' COMMENT 'why the operation is in this batch (first try, retry, half k of a bisection at depth d)';
-- +goose StatementEnd

-- +goose Down
ALTER TABLE merge_batch_member DROP COLUMN why;
ALTER TABLE merge_batch DROP COLUMN fail_class, DROP COLUMN depth, DROP COLUMN parent_id, DROP COLUMN grp, DROP COLUMN kind;
ALTER TABLE merge_batch_request DROP KEY idx_repo_group_waiting, DROP COLUMN tries, DROP COLUMN retries,
  DROP COLUMN half, DROP COLUMN depth, DROP COLUMN parent_id, DROP COLUMN kind, DROP COLUMN grp;
