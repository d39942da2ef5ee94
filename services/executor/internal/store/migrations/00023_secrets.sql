-- +goose Up
-- Company secrets (SPEC T3): runs name them (environment.secret_refs) and
-- never carry their values. One row per company and name holds the
-- current version, sealed (envelope encryption, internal/secrets): the
-- value under a fresh data key, the data key under the key of the
-- executor's -secrets-key-file, named by key_id. No API call reads
-- data_key or sealed_value back; only the dispatch of a run of the
-- company opens them, for the attach it sends to the run's gateway.
CREATE TABLE executor.secrets (
    company_id   text NOT NULL,
    name         text NOT NULL,
    version      bigint NOT NULL,
    key_id       text NOT NULL,
    data_key     bytea NOT NULL,
    sealed_value bytea NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text NOT NULL,
    PRIMARY KEY (company_id, name)
);

-- +goose Down
DROP TABLE executor.secrets;
