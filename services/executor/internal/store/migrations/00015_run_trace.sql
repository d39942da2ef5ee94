-- +goose Up
-- The W3C traceparent of the SubmitRun call that created a run (SPEC D3):
-- the dispatcher that claims the run later, in any replica, continues that
-- trace, so one trace spans submission, dispatch, the gateway, runnerd and
-- the provider call. NULL when the caller sent no trace context.
ALTER TABLE executor.runs ADD COLUMN trace_parent text;

-- +goose Down
ALTER TABLE executor.runs DROP COLUMN trace_parent;
