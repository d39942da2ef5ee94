-- +goose Up
-- Verified suspensions (SPEC R5). Every stamped checkpoint recorded for a
-- session scope; the newest one not superseded (no run of the scope has
-- attached a runner since) is what a replacement runner restores from.
CREATE TABLE executor.session_checkpoints (
    checkpoint_id         text PRIMARY KEY,
    session_scope         text NOT NULL,
    company_id            text NOT NULL,
    normalized_session_id text NOT NULL,
    -- The run whose idle period the suspension ended.
    last_run_id           text NOT NULL REFERENCES executor.runs (run_id),
    gateway_scope         text NOT NULL,
    manifest_digest       text NOT NULL,
    -- tether.backup.v1.Stamp, deterministic protobuf encoding.
    stamp                 bytea NOT NULL,
    lease_id              text NOT NULL,
    runner_instance_id    text NOT NULL,
    provider_thread_id    text NOT NULL DEFAULT '',
    reason                text NOT NULL,
    superseded_at         timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX session_checkpoints_scope_idx ON executor.session_checkpoints (session_scope, created_at DESC);

-- One row per scope: the idle period (the scope's last run) a replica is
-- suspending, has suspended, or failed to suspend. A claim is one
-- INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING, so one replica
-- suspends a scope at a time; an expired claim may be taken over.
CREATE TABLE executor.session_suspensions (
    session_scope text PRIMARY KEY,
    last_run_id   text NOT NULL,
    state         text NOT NULL,
    owner         text NOT NULL,
    claimed_until timestamptz NOT NULL,
    attempts      integer NOT NULL DEFAULT 1,
    last_error    text,
    checkpoint_id text,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- The idle sweep reads recently ended warm runs.
CREATE INDEX runs_warm_ended_idx ON executor.runs (ended_at) WHERE lifecycle = 'LIFECYCLE_MODE_WARM';

-- +goose Down
DROP INDEX executor.runs_warm_ended_idx;
DROP TABLE executor.session_suspensions;
DROP TABLE executor.session_checkpoints;
