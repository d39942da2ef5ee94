-- +goose Up
-- When a run began waiting unplaced for its current queued_reason: the
-- delay between its claims grows with it (placement.DeferDelay), so a run
-- waiting for a lost gateway (SPEC F7) is not claimed every poll.
ALTER TABLE executor.runs ADD COLUMN queued_since timestamptz;

-- +goose Down
ALTER TABLE executor.runs DROP COLUMN queued_since;
