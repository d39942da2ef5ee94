-- +goose Up
CREATE SCHEMA IF NOT EXISTS executor;

-- One row per run: what was asked and what came of it.
CREATE TABLE executor.runs (
    run_id                text PRIMARY KEY,
    submit_seq            bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    company_id            text NOT NULL,
    normalized_session_id text NOT NULL,
    session_scope         text NOT NULL,
    lifecycle             text NOT NULL,
    input                 bytea NOT NULL,
    input_digest          text NOT NULL,
    state                 text NOT NULL DEFAULT 'queued',
    result                bytea,
    failure_code          text,
    failure_message       text,
    runner_instance_id    text,
    runner_process        bytea,
    provider_process      bytea,
    event_count           bigint NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    started_at            timestamptz,
    ended_at              timestamptz
);
CREATE INDEX runs_session_idx ON executor.runs (session_scope, submit_seq);
CREATE INDEX runs_created_idx ON executor.runs (submit_seq DESC);

-- The run's authority: phase and fenced lease. Kept narrow so lease
-- renewals stay HOT updates (no index on lease_expires_at).
CREATE TABLE executor.coordinators (
    run_id           text PRIMARY KEY REFERENCES executor.runs (run_id),
    phase            text NOT NULL DEFAULT 'queued',
    attempt          bigint NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    next_attempt_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX coordinators_due_idx ON executor.coordinators (phase, next_attempt_at)
    WHERE phase IN ('queued', 'retryable_failure', 'observed');

-- Every persisted event of a run, in run-local order (seq from 1).
CREATE TABLE executor.events (
    run_id             text NOT NULL REFERENCES executor.runs (run_id),
    seq                bigint NOT NULL,
    source_instance_id text NOT NULL,
    source_seq         bigint NOT NULL,
    source_event_id    text NOT NULL,
    event_type         text NOT NULL,
    payload_sha256     bytea NOT NULL,
    event              bytea NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, source_instance_id, source_seq)
);

-- +goose Down
DROP SCHEMA executor CASCADE;
