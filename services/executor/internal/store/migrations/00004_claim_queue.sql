-- +goose Up
-- Claims read only coordinators: the queue order and session of a run, its
-- cancellation state and first-claim time live next to the lease, and
-- partial indexes keep the claim's scan to due runs and its session-order
-- check to one index probe. None of these indexes covers lease_expires_at,
-- so lease renewals stay HOT updates.
ALTER TABLE executor.coordinators
    ADD COLUMN session_scope text,
    ADD COLUMN submit_seq    bigint,
    ADD COLUMN cancel_state  text,
    ADD COLUMN started_at    timestamptz;
UPDATE executor.coordinators c
   SET session_scope = r.session_scope, submit_seq = r.submit_seq, started_at = r.started_at,
       cancel_state = r.result_metadata -> 'nativeCancellation' ->> 'dispatchState'
  FROM executor.runs r WHERE r.run_id = c.run_id;
ALTER TABLE executor.coordinators
    ALTER COLUMN session_scope SET NOT NULL,
    ALTER COLUMN submit_seq SET NOT NULL;
DROP INDEX executor.coordinators_due_idx;
CREATE INDEX coordinators_queue_idx ON executor.coordinators (submit_seq)
    WHERE phase IN ('queued', 'retryable_failure');
CREATE INDEX coordinators_open_session_idx ON executor.coordinators (session_scope, submit_seq)
    WHERE phase NOT IN ('completed', 'terminal_failure');
CREATE INDEX coordinators_observed_idx ON executor.coordinators (run_id)
    WHERE phase = 'observed';
-- Leave room in each page so a renewal can be a HOT update (no index
-- touched); renewals rewrite every held lease every TTL/3.
ALTER TABLE executor.coordinators SET (fillfactor = 50);

-- +goose Down
ALTER TABLE executor.coordinators RESET (fillfactor);
DROP INDEX executor.coordinators_observed_idx;
DROP INDEX executor.coordinators_open_session_idx;
DROP INDEX executor.coordinators_queue_idx;
CREATE INDEX coordinators_due_idx ON executor.coordinators (phase, next_attempt_at)
    WHERE phase IN ('queued', 'retryable_failure', 'observed');
ALTER TABLE executor.coordinators
    DROP COLUMN session_scope, DROP COLUMN submit_seq, DROP COLUMN cancel_state, DROP COLUMN started_at;
