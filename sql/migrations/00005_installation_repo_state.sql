-- +goose Up
-- batcherd schema v5: installation identity and repository health (issue #14).
--
-- installation: one row, written once by the first `batcherd migrate` (store.Migrate
-- inserts it with INSERT IGNORE, so later runs keep the first id). Its id names this
-- installation's batch branches, batcherd/<installation>/batch-<id>, and goes into every
-- batch commit as the Batcherd-Installation trailer: a second database pointed at the
-- same GitLab project (a staging install, a re-created database) counts batch ids from 1
-- again, and without the id its batch 1 would find — and adopt — the first one's MR.
-- The singleton column and its CHECK keep the table at one row.
--
-- repo_state: what replicas learned about each configured repository, so that every
-- replica answers GET /v1/repos the same: the GitLab state (ok, unauthorized,
-- forbidden, not_found, unreachable) and the last drift check (NULL counts before the
-- first one). drift_next_at is the drift loop's reservation (fetch, then a guarded
-- UPDATE that pushes it one interval ahead: one replica checks a repository per interval).
-- timeout_resume_at is when GitLab last stopped refusing the repository (401/403/404):
-- the batch timeout does not run while GitLab refuses us, and a held batch gets a whole
-- timeout again from then.

-- +goose StatementBegin
CREATE TABLE installation (
  singleton       TINYINT UNSIGNED NOT NULL DEFAULT 1,
  installation_id VARCHAR(12)      NOT NULL,
  created_at      DATETIME(6)      NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  PRIMARY KEY (singleton),
  CONSTRAINT ck_installation_singleton CHECK (singleton = 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TABLE repo_state (
  repo              VARCHAR(255)  NOT NULL,
  gitlab_state      VARCHAR(16)   NOT NULL DEFAULT 'ok',
  gitlab_detail     VARCHAR(512)  NOT NULL DEFAULT '',
  gitlab_changed_at DATETIME(6)   NULL,
  timeout_resume_at DATETIME(6)   NULL,
  drift_unexpected  INT           NULL,
  drift_missing     INT           NULL,
  drift_modified    INT           NULL,
  drift_checked_at  DATETIME(6)   NULL,
  drift_next_at     DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  version           BIGINT        NOT NULL DEFAULT 0,
  PRIMARY KEY (repo)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- +goose StatementEnd

-- binding.fold_key: the binding's file path folded to lower case (repository, target,
-- subject), indexed, so admission finds an active binding whose file differs only by
-- letter case (case-insensitive checkouts — macOS, Windows — would make them one file)
-- without scanning: 409 case_collision. Adding a STORED column rebuilds the table
-- (online in InnoDB; minutes for millions of bindings).

-- +goose StatementBegin
ALTER TABLE binding
  ADD COLUMN fold_key CHAR(64) AS (SHA2(CONCAT(repo, 0x00, LOWER(target), 0x00, LOWER(subject)), 256)) STORED,
  ADD KEY idx_binding_fold (fold_key);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE binding DROP KEY idx_binding_fold, DROP COLUMN fold_key;
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE repo_state;
-- +goose StatementEnd
-- +goose StatementBegin
DROP TABLE installation;
-- +goose StatementEnd
