-- +goose Up
-- ReplaceSession decisions (SPEC F3): an operator gives up a session
-- scope's provider thread, whose durable state is lost. Who, when and why
-- are kept for good; the scope's next run applies the decision (starts a
-- fresh provider session, records session.continuity_break) and is named
-- here, once.
CREATE TABLE executor.session_replacements (
    replacement_id        text PRIMARY KEY,
    session_scope         text NOT NULL,
    company_id            text NOT NULL,
    normalized_session_id text NOT NULL,
    requested_by          text NOT NULL,
    caller                text NOT NULL,
    reason                text NOT NULL,
    requested_at          timestamptz NOT NULL DEFAULT now(),
    applied_run_id        text REFERENCES executor.runs (run_id),
    applied_at            timestamptz
);
CREATE INDEX session_replacements_scope_idx ON executor.session_replacements (session_scope, requested_at DESC);
-- At most one pending decision per scope: asking again while one waits
-- returns it.
CREATE UNIQUE INDEX session_replacements_pending_idx ON executor.session_replacements (session_scope)
    WHERE applied_run_id IS NULL;

-- +goose Down
DROP TABLE executor.session_replacements;
