-- +goose Up
-- SPEC Q1: a warm session closed by CloseSession without suspension (its
-- runner and provider stopped) stops counting against max_warm_sessions at
-- once. One row per scope: the idle period (the scope's last run) that was
-- closed; a later run of the scope opens the session again.
CREATE TABLE executor.session_closes (
    session_scope text PRIMARY KEY,
    last_run_id   text NOT NULL,
    closed_at     timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE executor.session_closes;
