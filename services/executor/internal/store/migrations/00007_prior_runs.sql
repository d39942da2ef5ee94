-- +goose Up
-- E13 prior-run lookups: the other runs of a run's company, agent and
-- normalized session id, newest first, in one index range.
CREATE INDEX runs_prior_session_idx ON executor.runs (company_id, agent_id, normalized_session_id, submit_seq DESC);

-- +goose Down
DROP INDEX executor.runs_prior_session_idx;
