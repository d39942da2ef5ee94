-- +goose Up
-- Durable interactions (SPEC E4, E5): a question to a human that a run
-- waits on. A provider opens one through the built-in tether_ask_user tool
-- (continuation policy response_wake: the run yields until it is answered);
-- an input runtime request lost with its provider, or handed off durably,
-- becomes one (wake_assignee). Each is created once per idempotency key, in
-- the transaction that persists the event it comes from, so a replayed
-- event never creates a second one. An answer is recorded once, with the
-- continuation run it submitted (same answer again: same run).
CREATE TABLE executor.interactions (
  interaction_id      text PRIMARY KEY,
  idempotency_key     text NOT NULL UNIQUE,
  kind                text NOT NULL CHECK (kind IN ('ask_user_questions', 'request_confirmation', 'request_item_verdicts')),
  status              text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'answered')),
  source_run_id       text NOT NULL,
  company_id          text NOT NULL,
  title               text NOT NULL,
  summary             text NOT NULL DEFAULT '',
  continuation_policy text NOT NULL CHECK (continuation_policy IN ('response_wake', 'wake_assignee')),
  -- The provider process was lost with the request: the run does not yield
  -- on it (the fallback wakes the assignee instead).
  provider_lost       boolean NOT NULL DEFAULT false,
  runtime_request_id  text NOT NULL DEFAULT '',
  payload             jsonb NOT NULL,
  answers             jsonb,
  answer_digest       text,
  continuation_run_id text,
  created_at          timestamptz NOT NULL DEFAULT now(),
  answered_at         timestamptz
);
CREATE INDEX interactions_source_run_idx ON executor.interactions (source_run_id, created_at DESC);
CREATE INDEX interactions_status_idx ON executor.interactions (status, created_at DESC);

-- +goose Down
DROP TABLE executor.interactions;
