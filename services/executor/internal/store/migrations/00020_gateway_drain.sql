-- +goose Up
-- An operator's drain of a gateway (SPEC F4): durable, so heartbeats (which
-- set draining from the gateway's own shutdown) do not undo it.
ALTER TABLE executor.gateways
    ADD COLUMN drain_requested_at timestamptz,
    ADD COLUMN drain_reason       text,
    ADD COLUMN drain_moved        integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE executor.gateways DROP COLUMN drain_requested_at, DROP COLUMN drain_reason, DROP COLUMN drain_moved;
