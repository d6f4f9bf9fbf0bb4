-- +goose Up
-- batcherd schema v6: principals (issue #16). Who requested, approved, rejected,
-- withdrew and last retried each operation; who caused each audit event; idempotency
-- keys scoped to the principal that sent them (two callers may use the same key).
-- Names are at most 128 characters (internal/auth): the unique key (principal,
-- idem_key) is 4 x (128 + 128) = 1024 bytes, a real B-tree key well under InnoDB's
-- 3072-byte limit (longer, MariaDB would silently make it a HASH "long unique" key).
-- store.CheckSchema verifies the new unique key and the columns (I8). '' means nobody
-- recorded (rows written before this migration).

-- +goose StatementBegin
ALTER TABLE operation
  ADD COLUMN requested_by VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that applied',
  ADD COLUMN approved_by  VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that approved; auto = BATCHERD_AUTO_APPROVE or expiry',
  ADD COLUMN rejected_by  VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that rejected',
  ADD COLUMN withdrawn_by VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that withdrew',
  ADD COLUMN retried_by   VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal of the last operator retry';
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE audit_event
  ADD COLUMN actor VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that caused the event; empty for batcherd''s own loops';
-- +goose StatementEnd

-- +goose StatementBegin
ALTER TABLE idempotency_key
  ADD COLUMN principal VARCHAR(128) NOT NULL DEFAULT '' COMMENT 'principal that sent the key' AFTER id,
  DROP KEY uk_idem_key,
  ADD UNIQUE KEY uk_principal_key (principal, idem_key);
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
ALTER TABLE idempotency_key DROP KEY uk_principal_key, DROP COLUMN principal, ADD UNIQUE KEY uk_idem_key (idem_key);
-- +goose StatementEnd
-- +goose StatementBegin
ALTER TABLE audit_event DROP COLUMN actor;
-- +goose StatementEnd
-- +goose StatementBegin
ALTER TABLE operation DROP COLUMN retried_by, DROP COLUMN withdrawn_by, DROP COLUMN rejected_by,
  DROP COLUMN approved_by, DROP COLUMN requested_by;
-- +goose StatementEnd
