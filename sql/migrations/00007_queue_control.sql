-- +goose Up
-- batcherd schema v7: queue control (issue #17). A repository can be paused (a change
-- freeze) by a row in repo_control that every replica's claim reads inside its own
-- transaction; an operation can be withdrawn before it is claimed (status withdrawn:
-- operation.status is a VARCHAR, so the new state needs no type change); an operation
-- can be urgent, and urgent waiting rows are claimed first.
--
-- The urgent-first claim stays one index range read: the waiting rows carry their lane
-- (0 = urgent, 1 = normal) and both waiting indexes put it between the (repo, batch_id)
-- prefix and created_at, so "urgent first, then oldest" is plain index order, and the
-- claim group of the first row (a failed batch's retry or bisection half, which keep
-- their created_at and lane) is still read in index order too. store.CheckSchema
-- verifies both (I8). Rebuilding two secondary indexes is an in-place change in InnoDB.

-- +goose StatementBegin
ALTER TABLE operation
  MODIFY COLUMN status VARCHAR(20) NOT NULL COMMENT 'pending_approval queued in_batch merged failed rejected withdrawn',
  ADD COLUMN priority VARCHAR(8) NOT NULL DEFAULT 'normal' COMMENT 'normal | urgent';
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE merge_batch_request
  ADD COLUMN lane TINYINT NOT NULL DEFAULT 1 COMMENT '0 = urgent, 1 = normal: the claim reads lanes in ascending order',
  DROP KEY idx_repo_waiting,
  ADD KEY idx_repo_waiting (repo, batch_id, lane, created_at, id),
  DROP KEY idx_repo_group_waiting,
  ADD KEY idx_repo_group_waiting (repo, batch_id, grp, lane, created_at, id);
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE repo_control (
  repo         VARCHAR(255)  NOT NULL COMMENT 'partition key: GitLab project path',
  paused       TINYINT       NOT NULL DEFAULT 0,
  reason       VARCHAR(1024) NOT NULL DEFAULT '',
  paused_until DATETIME(6)   NULL COMMENT 'the pause ends by itself then (DB clock); NULL = until resumed',
  paused_by    VARCHAR(255)  NOT NULL DEFAULT '',
  paused_at    DATETIME(6)   NULL,
  version      BIGINT        NOT NULL DEFAULT 1,
  created_at   DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at   DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (repo)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
-- A repository's own history (paused, resumed): events keyed by repository rather than
-- by operation or batch.
ALTER TABLE audit_event
  ADD COLUMN repo VARCHAR(255) NULL,
  ADD KEY idx_repo (repo, id);
-- +goose StatementEnd

-- +goose Down
ALTER TABLE audit_event DROP KEY idx_repo, DROP COLUMN repo;
DROP TABLE repo_control;
ALTER TABLE merge_batch_request
  DROP KEY idx_repo_group_waiting,
  ADD KEY idx_repo_group_waiting (repo, batch_id, grp, created_at, id),
  DROP KEY idx_repo_waiting,
  ADD KEY idx_repo_waiting (repo, batch_id, created_at, id),
  DROP COLUMN lane;
ALTER TABLE operation DROP COLUMN priority,
  MODIFY COLUMN status VARCHAR(20) NOT NULL COMMENT 'pending_approval queued in_batch merged failed rejected';
