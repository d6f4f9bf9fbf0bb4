-- +goose Up
-- batcherd schema v8: the transactional outbox of events (issue #18). One row per event
-- and receiver (its index in BATCHERD_EVENTS_URL), written by the same transaction as the
-- state change it reports, so a crash can delay an event but never lose it. Receivers
-- progress independently: each row carries its own reservation (next_attempt_at),
-- attempts, last error and delivery time. order_key is the operation id (or batch:<id>
-- for a batch's own events): the dispatcher delivers a row only when every earlier row
-- (lower id) of the same order_key and receiver is delivered. id order is the order of
-- the changes: every change of one operation locks its operation row before it writes
-- its event, so a later change takes its id after the earlier one committed.
-- store.CheckSchema verifies the unique key and the indexes the dispatcher reads by.

-- +goose StatementBegin
CREATE TABLE event_outbox (
  id              BIGINT        NOT NULL AUTO_INCREMENT,
  receiver        SMALLINT      NOT NULL COMMENT 'index in BATCHERD_EVENTS_URL (0-based)',
  event_id        CHAR(36)      NOT NULL COMMENT 'the event id: the same for every receiver and retry (X-Batcherd-Delivery)',
  type            VARCHAR(32)   NOT NULL,
  order_key       VARCHAR(64)   NOT NULL COMMENT 'operation id, or batch:<id>: delivery order within it',
  operation_json  TEXT          NULL COMMENT 'the body''s "operation" object as written at the change',
  batch_json      TEXT          NULL COMMENT 'the body''s "batch" object as written at the change',
  created_at      DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'occurred_at',
  next_attempt_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'reservation signal for fetch -> tryLock',
  attempts        INT           NOT NULL DEFAULT 0 COMMENT 'deliveries tried; also the reservation guard',
  last_error      VARCHAR(255)  NOT NULL DEFAULT '',
  delivered_at    DATETIME(6)   NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_event_receiver (event_id, receiver),
  -- due rows: undelivered (NULL) and next_attempt_at passed; purge: delivered before a time
  KEY idx_due (delivered_at, next_attempt_at),
  -- order check: an undelivered earlier row of the same order_key and receiver
  KEY idx_order (order_key, receiver, delivered_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DROP TABLE event_outbox;
-- +goose StatementEnd
