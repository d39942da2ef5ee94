-- +goose Up
-- Claims whose cost does not grow with the runs queued behind busy sessions.
-- Runs of one session scope run one at a time in submission order, so only
-- a scope's head (its earliest unfinished run) can ever be claimed. Before,
-- the claim walked every queued run in submit_seq order and probed, for
-- each, whether an earlier run of its scope was unfinished: with 100k runs
-- waiting behind 10 busy sessions one empty claim attempt read 100k rows.
--
-- Now each coordinator carries scope_head, true on exactly one unfinished
-- run of each scope: its earliest (of two submissions racing into an idle
-- scope, the one that commits first), and the claim walks only queued heads
-- (coordinators_head_queue_idx). Blocked runs are not in that index, and a
-- busy head (observed) is not either. scope_head is kept in the same
-- transaction as the change that moves it, by triggers, whichever statement
-- ends a run (a terminal event, a terminal failure, a cancellation):
--   * a new coordinator is the head when its scope has no unfinished run;
--   * when a run ends, the earliest unfinished run of its scope becomes the
--     head (a no-op when an earlier run still is).
-- Both take a transaction-scoped advisory lock on the scope first, so a
-- submission racing the end of its scope's head sees the other's commit:
-- without it the new run could see the head unfinished while the ending
-- head does not yet see the new run, and the scope would be left headless.
-- scope_head is meaningful only while a run is unfinished (a finished run
-- keeps whatever it had; no claim reads it). Lease renewals never touch
-- phase or scope_head, so they stay HOT updates.
ALTER TABLE executor.coordinators ADD COLUMN scope_head boolean NOT NULL DEFAULT false;

UPDATE executor.coordinators c SET scope_head = true
  FROM (SELECT DISTINCT ON (session_scope) run_id FROM executor.coordinators
         WHERE phase NOT IN ('completed', 'terminal_failure')
         ORDER BY session_scope, submit_seq) h
 WHERE c.run_id = h.run_id;

CREATE INDEX coordinators_head_queue_idx ON executor.coordinators (submit_seq)
    WHERE scope_head AND phase IN ('queued', 'retryable_failure');
DROP INDEX executor.coordinators_queue_idx;

-- +goose StatementBegin
CREATE FUNCTION executor.lock_scope(scope text) RETURNS void LANGUAGE sql AS $$
  SELECT pg_advisory_xact_lock(hashtext('tether.executor.scope_head'), hashtext(scope))
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION executor.scope_head_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM executor.lock_scope(NEW.session_scope);
  NEW.scope_head := NEW.phase NOT IN ('completed', 'terminal_failure') AND NOT EXISTS (
    SELECT 1 FROM executor.coordinators c
     WHERE c.session_scope = NEW.session_scope AND c.phase NOT IN ('completed', 'terminal_failure'));
  RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION executor.scope_head_on_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM executor.lock_scope(NEW.session_scope);
  UPDATE executor.coordinators SET scope_head = true
   WHERE run_id = (SELECT c.run_id FROM executor.coordinators c
                    WHERE c.session_scope = NEW.session_scope AND c.phase NOT IN ('completed', 'terminal_failure')
                    ORDER BY c.submit_seq LIMIT 1)
     AND NOT scope_head;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER coordinators_scope_head_insert BEFORE INSERT ON executor.coordinators
    FOR EACH ROW EXECUTE FUNCTION executor.scope_head_on_insert();
CREATE TRIGGER coordinators_scope_head_end AFTER UPDATE OF phase ON executor.coordinators
    FOR EACH ROW WHEN (OLD.phase NOT IN ('completed', 'terminal_failure') AND NEW.phase IN ('completed', 'terminal_failure'))
    EXECUTE FUNCTION executor.scope_head_on_end();

-- +goose Down
DROP TRIGGER coordinators_scope_head_end ON executor.coordinators;
DROP TRIGGER coordinators_scope_head_insert ON executor.coordinators;
DROP FUNCTION executor.scope_head_on_end();
DROP FUNCTION executor.scope_head_on_insert();
DROP FUNCTION executor.lock_scope(text);
CREATE INDEX coordinators_queue_idx ON executor.coordinators (submit_seq)
    WHERE phase IN ('queued', 'retryable_failure');
DROP INDEX executor.coordinators_head_queue_idx;
ALTER TABLE executor.coordinators DROP COLUMN scope_head;
