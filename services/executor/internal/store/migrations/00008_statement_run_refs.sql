-- +goose Up
-- Lease renewal (RenewLeases) reads one owner's held leases in one index
-- range and matches them to the renewal batch with a hash join, instead of
-- one index probe per renewed lease. A renewal never changes lease_owner or
-- phase, so renewals stay HOT updates.
CREATE INDEX coordinators_owner_idx ON executor.coordinators (lease_owner, run_id) WHERE phase = 'observed';

-- The references of events and coordinators to their run, checked once per
-- statement instead of once per row. A foreign key runs one lookup query
-- per inserted event, and fetches every updated coordinator row a second
-- time just to see that run_id did not change (a renewal of N leases paid N
-- fetches, an append of N events N queries). These triggers keep the same
-- guarantees:
--   * a statement inserting events or coordinators fails with
--     foreign_key_violation (23503) unless every run it names exists; it
--     locks those runs FOR KEY SHARE, as a foreign key check does, so a
--     concurrent delete waits for it and then fails;
--   * a run referenced by an event or a coordinator cannot be deleted
--     (23503); TRUNCATE of runs is refused while either table has rows;
--   * run_id of runs, coordinators and events is never updated (23503):
--     stricter than ON UPDATE NO ACTION, and nothing updates it.
-- +goose StatementBegin
CREATE FUNCTION executor.check_run_refs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  missing text;
BEGIN
  SELECT n.run_id INTO missing
    FROM (SELECT DISTINCT run_id FROM new_rows) n
   WHERE NOT EXISTS (SELECT 1 FROM executor.runs r WHERE r.run_id = n.run_id FOR KEY SHARE OF r)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'insert or update on table "%" violates foreign key constraint "%"', TG_TABLE_NAME, TG_TABLE_NAME || '_run_id_fkey'
      USING ERRCODE = 'foreign_key_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            CONSTRAINT = TG_TABLE_NAME || '_run_id_fkey',
            DETAIL = format('Key (run_id)=(%s) is not present in table "runs".', missing);
  END IF;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION executor.check_run_unreferenced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    IF EXISTS (SELECT 1 FROM executor.coordinators) OR EXISTS (SELECT 1 FROM executor.events) THEN
      RAISE EXCEPTION 'cannot truncate table "runs" while coordinators or events reference it'
        USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NULL;
  END IF;
  IF EXISTS (SELECT 1 FROM executor.coordinators WHERE run_id = OLD.run_id)
     OR EXISTS (SELECT 1 FROM executor.events WHERE run_id = OLD.run_id) THEN
    RAISE EXCEPTION 'update or delete on table "runs" violates foreign key constraint "run_refs" on coordinators or events'
      USING ERRCODE = 'foreign_key_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME, CONSTRAINT = 'run_refs',
            DETAIL = format('Key (run_id)=(%s) is still referenced.', OLD.run_id);
  END IF;
  RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION executor.refuse_run_id_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'run_id of table "%" is never updated', TG_TABLE_NAME
    USING ERRCODE = 'foreign_key_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME;
END
$$;
-- +goose StatementEnd

ALTER TABLE executor.events DROP CONSTRAINT events_run_id_fkey;
ALTER TABLE executor.coordinators DROP CONSTRAINT coordinators_run_id_fkey;

CREATE TRIGGER events_run_refs AFTER INSERT ON executor.events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_run_refs();
CREATE TRIGGER coordinators_run_refs AFTER INSERT ON executor.coordinators
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_run_refs();
CREATE TRIGGER events_run_id_fixed BEFORE UPDATE OF run_id ON executor.events
    FOR EACH STATEMENT EXECUTE FUNCTION executor.refuse_run_id_update();
CREATE TRIGGER coordinators_run_id_fixed BEFORE UPDATE OF run_id ON executor.coordinators
    FOR EACH STATEMENT EXECUTE FUNCTION executor.refuse_run_id_update();
CREATE TRIGGER runs_run_id_fixed BEFORE UPDATE OF run_id ON executor.runs
    FOR EACH STATEMENT EXECUTE FUNCTION executor.refuse_run_id_update();
CREATE TRIGGER runs_referenced AFTER DELETE ON executor.runs
    FOR EACH ROW EXECUTE FUNCTION executor.check_run_unreferenced();
CREATE TRIGGER runs_referenced_truncate BEFORE TRUNCATE ON executor.runs
    FOR EACH STATEMENT EXECUTE FUNCTION executor.check_run_unreferenced();

-- +goose Down
DROP TRIGGER runs_referenced_truncate ON executor.runs;
DROP TRIGGER runs_referenced ON executor.runs;
DROP TRIGGER runs_run_id_fixed ON executor.runs;
DROP TRIGGER coordinators_run_id_fixed ON executor.coordinators;
DROP TRIGGER events_run_id_fixed ON executor.events;
DROP TRIGGER coordinators_run_refs ON executor.coordinators;
DROP TRIGGER events_run_refs ON executor.events;
ALTER TABLE executor.coordinators ADD CONSTRAINT coordinators_run_id_fkey FOREIGN KEY (run_id) REFERENCES executor.runs (run_id);
ALTER TABLE executor.events ADD CONSTRAINT events_run_id_fkey FOREIGN KEY (run_id) REFERENCES executor.runs (run_id);
DROP FUNCTION executor.refuse_run_id_update();
DROP FUNCTION executor.check_run_unreferenced();
DROP FUNCTION executor.check_run_refs();
DROP INDEX executor.coordinators_owner_idx;
