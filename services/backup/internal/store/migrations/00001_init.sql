-- +goose Up
CREATE SCHEMA IF NOT EXISTS backup;

-- One row per stored checkpoint: its manifest (canonical JSON, the bytes the
-- manifest digest covers) and where and what its archive is.
CREATE TABLE backup.checkpoints (
    checkpoint_id         text PRIMARY KEY,
    session_scope         text NOT NULL,
    normalized_session_id text NOT NULL,
    runner_instance_id    text NOT NULL,
    source_lease_id       text NOT NULL,
    provider_kind         text NOT NULL,
    driver_kind           text NOT NULL,
    manifest              bytea NOT NULL,
    manifest_digest       text NOT NULL UNIQUE,
    blob_key              text NOT NULL UNIQUE,
    archive_sha256        text NOT NULL,
    archive_bytes         bigint NOT NULL CHECK (archive_bytes >= 0),
    expanded_bytes        bigint NOT NULL CHECK (expanded_bytes >= 0),
    entries               integer NOT NULL CHECK (entries >= 0),
    completed_at          timestamptz NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX checkpoints_scope_idx ON backup.checkpoints (session_scope, created_at DESC);

-- Every stamp issued: which lease a checkpoint authorised, and when.
CREATE TABLE backup.stamps (
    checkpoint_id text NOT NULL REFERENCES backup.checkpoints (checkpoint_id) ON DELETE CASCADE,
    lease_id      text NOT NULL,
    issued_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (checkpoint_id, lease_id)
);

-- +goose Down
DROP SCHEMA backup CASCADE;
