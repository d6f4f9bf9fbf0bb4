-- +goose Up
-- batcherd schema v1. Every constraint the invariants rely on (docs/ARCHITECTURE.md, I1–I8) lives here
-- and is re-checked at start-up by store.CheckSchema (I8). Keep unique keys under
-- InnoDB's 3072-byte limit: MariaDB silently turns longer ones into HASH "long unique"
-- keys whose lookups scan the table.

-- +goose StatementBegin
CREATE TABLE merge_batch (
  id            BIGINT        NOT NULL AUTO_INCREMENT,
  repo          VARCHAR(255)  NOT NULL COMMENT 'partition key: GitLab project path',
  status        TINYINT       NOT NULL DEFAULT 1 COMMENT '1=RUNNING 2=SUCCEEDED 3=FAILED 4=BLOCKED',
  -- I1: one active (RUNNING/BLOCKED) batch per repository. A UNIQUE index allows many NULLs,
  -- so terminal batches (NULL) coexist while active ones collide on the repository.
  active_slot   VARCHAR(255)  GENERATED ALWAYS AS (CASE WHEN status IN (1, 4) THEN repo ELSE NULL END) STORED,
  version       BIGINT        NOT NULL DEFAULT 1,
  size          INT           NOT NULL DEFAULT 0,
  source_branch VARCHAR(255)  NOT NULL DEFAULT '',
  mr_iid        BIGINT        NULL,
  mr_url        VARCHAR(1024) NOT NULL DEFAULT '',
  mr_sha        VARCHAR(64)   NOT NULL DEFAULT '' COMMENT 'head sha batcherd committed; every merge is guarded on it',
  next_check_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'reservation signal for fetch -> tryLock',
  error_code    VARCHAR(64)   NOT NULL DEFAULT '',
  error_message VARCHAR(1024) NOT NULL DEFAULT '',
  created_at    DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at    DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  finished_at   DATETIME(6)   NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_active_slot (active_slot),
  KEY idx_status_next_check (status, next_check_at, id),
  KEY idx_status_updated (status, updated_at, id),
  KEY idx_repo_status (repo, status, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE merge_batch_request (
  id           BIGINT       NOT NULL AUTO_INCREMENT,
  operation_id CHAR(36)     NOT NULL,
  repo         VARCHAR(255) NOT NULL,
  batch_id     BIGINT       NULL COMMENT 'NULL while waiting',
  created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  -- I4: admitting the same operation twice queues it once.
  UNIQUE KEY uk_operation_id (operation_id),
  -- "waiting requests of a repository, oldest first"
  KEY idx_repo_waiting (repo, batch_id, created_at, id),
  KEY idx_batch (batch_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE merge_batch_member (
  batch_id     BIGINT      NOT NULL,
  operation_id CHAR(36)    NOT NULL,
  created_at   DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (batch_id, operation_id),
  KEY idx_operation (operation_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE operation (
  id            BIGINT        NOT NULL AUTO_INCREMENT,
  operation_id  CHAR(36)      NOT NULL,
  subject       VARCHAR(255)  NOT NULL,
  target        VARCHAR(255)  NOT NULL,
  repo          VARCHAR(255)  NOT NULL,
  action        VARCHAR(8)    NOT NULL COMMENT 'grant | revoke',
  status        VARCHAR(20)   NOT NULL COMMENT 'pending_approval queued in_batch merged failed rejected',
  version       BIGINT        NOT NULL DEFAULT 1,
  expires_at    DATETIME(6)   NULL,
  attributes    JSON          NULL,
  batch_id      BIGINT        NULL,
  attempts      INT           NOT NULL DEFAULT 0,
  error_code    VARCHAR(64)   NOT NULL DEFAULT '',
  error_message VARCHAR(1024) NOT NULL DEFAULT '',
  created_at    DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at    DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_operation_id (operation_id),
  KEY idx_relation (subject, target, id),
  KEY idx_batch (batch_id),
  KEY idx_status_updated (status, updated_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE binding (
  id           BIGINT       NOT NULL AUTO_INCREMENT,
  subject      VARCHAR(255) NOT NULL,
  target       VARCHAR(255) NOT NULL,
  repo         VARCHAR(255) NOT NULL,
  status       VARCHAR(16)  NOT NULL COMMENT 'pending active revoking closed rejected failed',
  operation_id CHAR(36)     NOT NULL COMMENT 'latest operation on this relation',
  expires_at   DATETIME(6)  NULL,
  version      BIGINT       NOT NULL DEFAULT 1,
  created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  updated_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  -- I5: one row per (subject, target). 2 x 255 x 4 bytes = 2040 < 3072, a real B-tree key.
  UNIQUE KEY uk_subject_target (subject, target),
  KEY idx_target (target),
  KEY idx_status_expires (status, expires_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE idempotency_key (
  id           BIGINT       NOT NULL AUTO_INCREMENT,
  idem_key     VARCHAR(128) NOT NULL,
  fingerprint  CHAR(64)     NOT NULL COMMENT 'sha256 of the canonical request',
  operation_id CHAR(36)     NOT NULL,
  expires_at   DATETIME(6)  NOT NULL,
  created_at   DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_idem_key (idem_key),
  KEY idx_expires (expires_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE audit_event (
  id           BIGINT        NOT NULL AUTO_INCREMENT,
  dedupe_key   VARCHAR(191)  NOT NULL COMMENT 're-recording the same event is a no-op',
  operation_id CHAR(36)      NULL,
  batch_id     BIGINT        NULL,
  code         VARCHAR(32)   NOT NULL,
  detail       VARCHAR(2048) NOT NULL DEFAULT '',
  created_at   DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (id),
  UNIQUE KEY uk_dedupe (dedupe_key),
  KEY idx_operation (operation_id, id),
  KEY idx_batch (batch_id, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose Down
DROP TABLE audit_event;
DROP TABLE idempotency_key;
DROP TABLE binding;
DROP TABLE operation;
DROP TABLE merge_batch_member;
DROP TABLE merge_batch_request;
DROP TABLE merge_batch;
