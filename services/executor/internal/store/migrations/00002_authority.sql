-- +goose Up
-- The run's own governance binding, result metadata (durable cancellation
-- record and other receipts, merged key by key) and recovery projection.
ALTER TABLE executor.runs
    ADD COLUMN issue_id        text  NOT NULL DEFAULT '',
    ADD COLUMN agent_id        text  NOT NULL DEFAULT '',
    ADD COLUMN result_metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN recovery        jsonb;

-- Claim facts: a durable result id, the binding the run was submitted with,
-- the provider-turn generation (bumped by a retry, kept by a takeover), and
-- the controller process that holds the lease (for same-host takeover).
ALTER TABLE executor.coordinators
    ADD COLUMN result_id              text,
    ADD COLUMN binding_digest         text   NOT NULL DEFAULT '',
    ADD COLUMN turn_generation        bigint NOT NULL DEFAULT 0,
    ADD COLUMN controller_boot_id     text,
    ADD COLUMN controller_pid         integer,
    ADD COLUMN controller_start_ticks bigint;

-- Audit trail: who did what to which run, issue and company.
CREATE TABLE executor.activities (
    activity_id text PRIMARY KEY,
    actor       text NOT NULL,
    action      text NOT NULL,
    company_id  text NOT NULL,
    issue_id    text NOT NULL,
    run_id      text NOT NULL REFERENCES executor.runs (run_id),
    details     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX activities_run_idx ON executor.activities (run_id, created_at);

-- +goose Down
DROP TABLE executor.activities;
ALTER TABLE executor.coordinators
    DROP COLUMN result_id, DROP COLUMN binding_digest, DROP COLUMN turn_generation,
    DROP COLUMN controller_boot_id, DROP COLUMN controller_pid, DROP COLUMN controller_start_ticks;
ALTER TABLE executor.runs
    DROP COLUMN issue_id, DROP COLUMN agent_id, DROP COLUMN result_metadata, DROP COLUMN recovery;
