-- +goose Up
-- SPEC R9: every event row belongs to a lease. The store already writes
-- each row under the fence of the run it files it under; these rules make
-- the database refuse a row that breaks it, whatever code path writes it:
--   * a run has at most one run.terminal (events_one_terminal_idx, 23505);
--   * no row of a run follows its run.terminal (events_after_terminal);
--   * every row is written by the run's current attempt, the one its
--     coordinator holds (events_writer_fence): a stale attempt, or a
--     writer outside any lease (writer_attempt 0 once the run was
--     claimed), is refused.
-- Both checks raise check_violation (23514) naming the constraint, once
-- per statement (transition table), like the run reference checks of
-- 00008 (which fire first: triggers fire in name order). The terminal row
-- of a run is found through the partial index.
CREATE UNIQUE INDEX events_one_terminal_idx ON executor.events (run_id) WHERE event_type = 'run.terminal';

-- +goose StatementBegin
CREATE FUNCTION executor.check_event_fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  bad record;
BEGIN
  WITH n AS (SELECT run_id, max(seq) AS max_seq FROM new_rows GROUP BY run_id)
  SELECT n.run_id, t.seq AS terminal_seq INTO bad
    FROM n JOIN executor.events t ON t.run_id = n.run_id AND t.event_type = 'run.terminal'
   WHERE n.max_seq > t.seq
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'event of run % written after its run.terminal (seq %)', bad.run_id, bad.terminal_seq
      USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            CONSTRAINT = 'events_after_terminal';
  END IF;
  WITH n AS (
    SELECT run_id, min(writer_attempt) AS lo, max(writer_attempt) AS hi
      FROM new_rows GROUP BY run_id)
  SELECT n.run_id, n.lo, n.hi, c.attempt INTO bad
    FROM n
    LEFT JOIN executor.coordinators c ON c.run_id = n.run_id
   WHERE c.run_id IS NULL OR n.lo <> c.attempt OR n.hi <> c.attempt
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'event of run % written by attempt % while the run''s attempt is %', bad.run_id,
        CASE WHEN bad.lo <> bad.attempt THEN bad.lo ELSE bad.hi END, coalesce(bad.attempt::text, 'missing')
      USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            CONSTRAINT = 'events_writer_fence';
  END IF;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER events_within_fence AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_event_fence();

-- Session events a verified idle suspension reported while no run of the
-- scope held a lease (the last run ended, the next was not claimed yet).
-- They wait here and are filed under the next run of the scope, under its
-- fence, when it attaches.
CREATE TABLE executor.parked_events (
    session_scope      text NOT NULL,
    source_instance_id text NOT NULL,
    source_seq         bigint NOT NULL,
    payload_sha256     bytea NOT NULL,
    event              bytea NOT NULL,
    parked_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_instance_id, source_seq)
);
CREATE INDEX parked_events_scope_idx ON executor.parked_events (session_scope);

-- +goose Down
DROP TABLE executor.parked_events;
DROP TRIGGER events_within_fence ON executor.events;
DROP FUNCTION executor.check_event_fence();
DROP INDEX executor.events_one_terminal_idx;
