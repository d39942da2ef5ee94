-- +goose Up
-- Placement of session scopes on runner gateways (SPEC F2): a scope runs on
-- one gateway (its durable root lives on that gateway's disk) from its
-- first run on; a move (drain, failover) rewrites the row. No foreign key to
-- executor.gateways: an executor's static -gateway-id need not be
-- registered.
CREATE TABLE executor.placements (
    session_scope text PRIMARY KEY,
    gateway_id    text NOT NULL,
    placed_at     timestamptz NOT NULL DEFAULT now(),
    -- The gateway the scope was moved off last, and how often it moved.
    moved_from    text,
    moves         integer NOT NULL DEFAULT 0,
    -- Set while a drain moves the scope (a verified suspension on its
    -- gateway, then the new placement): its runs wait meanwhile.
    moving_until  timestamptz
);
CREATE INDEX placements_gateway_idx ON executor.placements (gateway_id, placed_at);

-- Why a queued run waits (e.g. gateway_capacity_exhausted), shown by GetRun
-- while it is queued.
ALTER TABLE executor.runs ADD COLUMN queued_reason text, ADD COLUMN queued_message text;

-- +goose Down
ALTER TABLE executor.runs DROP COLUMN queued_reason, DROP COLUMN queued_message;
DROP TABLE executor.placements;
