-- +goose Up
-- The run's latest provider plan as rendered Markdown (SPEC E3), written in
-- the transaction that stores its run.plan_updated event (or the run's
-- result), so GetRun and ListRuns read it with the run row they already
-- fetch and it can never disagree with the event stream.
ALTER TABLE executor.runs ADD COLUMN plan text;

-- +goose Down
ALTER TABLE executor.runs DROP COLUMN plan;
