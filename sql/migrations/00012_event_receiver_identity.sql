-- +goose Up
-- batcherd schema v12: an outbox row names its receiver by identity, not by position
-- (README "Events"): receiver was the index of the receiver in BATCHERD_EVENTS_URL, so
-- reordering or shortening the list (or two replicas with different lists during a
-- rolling update) sent pending events to another receiver. It now holds the receiver's
-- identity (domain.ReceiverID: from its name=, else its URL; always >= 2^62). Rows
-- written before keep their small position: a replica delivers those to the receiver at
-- that position of its own list, as before.

-- +goose StatementBegin
ALTER TABLE event_outbox MODIFY receiver BIGINT NOT NULL
  COMMENT 'receiver identity (domain.ReceiverID); 0-99: a position in BATCHERD_EVENTS_URL, rows written before v12';
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DELETE FROM event_outbox WHERE receiver > 32767;
ALTER TABLE event_outbox MODIFY receiver SMALLINT NOT NULL COMMENT 'index in BATCHERD_EVENTS_URL (0-based)';
-- +goose StatementEnd
