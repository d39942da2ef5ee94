-- +goose Up
-- Who did it (SPEC T2): the authenticated principal that submitted a run,
-- answered an interaction and asked for a gateway's drain, as the
-- authorizer named it (in loopback development mode, the caller's peer);
-- never text the caller wrote. NULL on rows from before.
ALTER TABLE executor.runs ADD COLUMN submitted_by text;
ALTER TABLE executor.interactions ADD COLUMN answered_by text;
ALTER TABLE executor.gateways ADD COLUMN drain_requested_by text;

-- +goose Down
ALTER TABLE executor.gateways DROP COLUMN drain_requested_by;
ALTER TABLE executor.interactions DROP COLUMN answered_by;
ALTER TABLE executor.runs DROP COLUMN submitted_by;
