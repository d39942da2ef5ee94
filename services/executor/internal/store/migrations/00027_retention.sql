-- +goose Up
-- SPEC L1: how long a company's ended runs are kept and how many
-- checkpoints of each of its sessions. One row per company that has its own
-- policy and one row '*' for every other company. NULL runs_retention:
-- ended runs are kept for good; NULL checkpoints_kept: every checkpoint is
-- kept. Whatever the policy, the newest run of a session and the
-- checkpoint a session restores from are kept (see store/retention.go).
CREATE TABLE executor.retention_settings (
    company_id          text PRIMARY KEY,
    runs_retention_secs bigint CHECK (runs_retention_secs >= 3600),
    checkpoints_kept    integer CHECK (checkpoints_kept >= 1),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    updated_by          text NOT NULL
);
INSERT INTO executor.retention_settings (company_id, runs_retention_secs, checkpoints_kept, updated_by)
VALUES ('*', NULL, NULL, 'migration 00027');

-- What operators did that no run keeps a trace of (DeleteRun, PurgeCompany,
-- retention changes): activities name a run that exists, these outlive it.
CREATE TABLE executor.operator_actions (
    action_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action     text NOT NULL,
    principal  text NOT NULL,
    company_id text NOT NULL,
    run_id     text,
    reason     text NOT NULL DEFAULT '',
    details    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_actions_company_idx ON executor.operator_actions (company_id, created_at);

-- Fleet-wide jobs that one executor runs at a time (the retention purge):
-- the replica holding an unexpired row runs the job and renews it.
CREATE TABLE executor.job_leases (
    job        text PRIMARY KEY,
    owner      text NOT NULL,
    expires_at timestamptz NOT NULL
);

-- The purge walks ended runs oldest first.
CREATE INDEX runs_ended_idx ON executor.runs (ended_at) WHERE ended_at IS NOT NULL;

-- +goose Down
DROP INDEX executor.runs_ended_idx;
DROP TABLE executor.job_leases;
DROP TABLE executor.operator_actions;
DROP TABLE executor.retention_settings;
