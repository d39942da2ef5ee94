-- +goose Up
-- SPEC L2, first step: every event row carries its run's creation time,
-- run_created_at, the key executor.events is range-partitioned by once an
-- operator runs `executor migrate -partition-events` (store/partitions.go).
-- The key is constant per run, so all of a run's rows land in one
-- partition and the events' unique keys — (run_id, seq), (run_id,
-- source_instance_id, source_seq), one run.terminal per run — stay as
-- strong as on one table.
--
-- This migration only adds: executors of the previous release keep
-- working on it during a rolling upgrade.
--   * The column is nullable and has no default (no table rewrite).
--   * This release's executors write it. A row inserted without it (an
--     executor of the previous release) gets it from its run, by the row
--     trigger below; the trigger's WHEN clause keeps it off the path of
--     rows that name it.
--   * The statement check of the events' run references (00008) also
--     checks that the key is the run's creation time (check_violation,
--     constraint events_run_created_at).
--   * Replicas record that they write the key, so that the partitioning
--     step can refuse while an executor that does not is alive.
-- Rows stored before this migration are backfilled by the partitioning
-- step, in batches of runs. It locks only executor.events and
-- executor.replicas: an append holds executor.runs (its fence UPDATE)
-- while it waits for executor.events, so a migration that also waited for
-- runs would deadlock with it (the runs index is 00029, built
-- concurrently).
ALTER TABLE executor.events ADD COLUMN run_created_at timestamptz;

-- +goose StatementBegin
CREATE FUNCTION executor.events_run_created_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  NEW.run_created_at := (SELECT created_at FROM executor.runs WHERE run_id = NEW.run_id);
  RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER events_run_created_at BEFORE INSERT ON executor.events
    FOR EACH ROW WHEN (NEW.run_created_at IS NULL) EXECUTE FUNCTION executor.events_run_created_at();

-- check_run_refs (00008) for events: every run named exists (locked FOR
-- KEY SHARE, foreign_key_violation otherwise) and each row's
-- run_created_at is its run's created_at, in one query per statement.
-- +goose StatementBegin
CREATE FUNCTION executor.check_event_run_refs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  bad record;
BEGIN
  SELECT n.run_id, r.run_id IS NULL AS missing INTO bad
    FROM (SELECT DISTINCT run_id, run_created_at FROM new_rows) n
    LEFT JOIN LATERAL (SELECT x.run_id, x.created_at FROM executor.runs x WHERE x.run_id = n.run_id FOR KEY SHARE OF x) r ON true
   WHERE r.run_id IS NULL OR n.run_created_at IS DISTINCT FROM r.created_at
   LIMIT 1;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF bad.missing THEN
    RAISE EXCEPTION 'insert or update on table "%" violates foreign key constraint "%"', TG_TABLE_NAME, TG_TABLE_NAME || '_run_id_fkey'
      USING ERRCODE = 'foreign_key_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            CONSTRAINT = TG_TABLE_NAME || '_run_id_fkey',
            DETAIL = format('Key (run_id)=(%s) is not present in table "runs".', bad.run_id);
  END IF;
  RAISE EXCEPTION 'event of run % does not carry its run''s creation time as run_created_at', bad.run_id
    USING ERRCODE = 'check_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
          CONSTRAINT = 'events_run_created_at';
END
$$;
-- +goose StatementEnd
DROP TRIGGER events_run_refs ON executor.events;
CREATE TRIGGER events_run_refs AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_event_run_refs();

ALTER TABLE executor.replicas ADD COLUMN writes_run_created_at boolean;

-- The partitions of executor.events once it is partitioned: from_at NULL
-- is the table from before (every run created before to_at).
CREATE TABLE executor.event_partitions (
    name    text PRIMARY KEY,
    from_at timestamptz,
    to_at   timestamptz NOT NULL UNIQUE
);


-- +goose Down
DROP TABLE executor.event_partitions;
ALTER TABLE executor.replicas DROP COLUMN writes_run_created_at;
DROP TRIGGER events_run_refs ON executor.events;
CREATE TRIGGER events_run_refs AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_run_refs();
DROP FUNCTION executor.check_event_run_refs();
DROP TRIGGER events_run_created_at ON executor.events;
DROP FUNCTION executor.events_run_created_at();
ALTER TABLE executor.events DROP COLUMN run_created_at;
