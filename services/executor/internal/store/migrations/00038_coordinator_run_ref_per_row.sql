-- +goose Up
-- SPEC P1: a submission's coordinator checks its run in the row trigger it
-- already fires (coordinators_company_insert), not in a statement trigger
-- of its own. coordinators_run_refs (migration 00008) is an AFTER
-- statement trigger with a transition table: the statement's rows are
-- captured into a tuplestore, queued, and checked at its end by a PL/pgSQL
-- call and a query, ≈ 20 % of PostgreSQL's CPU per SubmitRun for the one
-- row a submission inserts. It also locked FOR KEY SHARE the run the same
-- statement had just inserted (a WAL record and a dirtied page for a row no
-- other transaction can see yet).
--
-- The guarantees stay those of 00008:
--   * a coordinator insert fails with foreign_key_violation (23503) unless
--     its run exists, and it locks that run FOR KEY SHARE, as a foreign key
--     check does, so a concurrent delete waits for it and then fails;
--   * except a run this transaction inserted: no other transaction can
--     delete it before the commit, and once the coordinator exists the run
--     cannot be deleted (runs_referenced) — nothing to lock against.
-- The row trigger sees the run whatever statement of the transaction
-- inserted it (a submission inserts both in one statement; PL/pgSQL's
-- queries see the rows the statement's earlier steps wrote, as the
-- company lookup of 00031 has since then).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION executor.company_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  run_company text;
  inserted_here boolean;
BEGIN
  SELECT r.company_id, r.xmin = pg_current_xact_id()::xid INTO run_company, inserted_here
    FROM executor.runs r WHERE r.run_id = NEW.run_id;
  IF FOUND AND NOT inserted_here THEN
    PERFORM FROM executor.runs r WHERE r.run_id = NEW.run_id FOR KEY SHARE OF r;
  END IF;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'insert or update on table "%" violates foreign key constraint "%"', TG_TABLE_NAME, TG_TABLE_NAME || '_run_id_fkey'
      USING ERRCODE = 'foreign_key_violation', SCHEMA = TG_TABLE_SCHEMA, TABLE = TG_TABLE_NAME,
            CONSTRAINT = TG_TABLE_NAME || '_run_id_fkey',
            DETAIL = format('Key (run_id)=(%s) is not present in table "runs".', NEW.run_id);
  END IF;
  IF NEW.company_id IS NULL THEN
    NEW.company_id := run_company;
  END IF;
  INSERT INTO executor.company_state (company_id) VALUES (NEW.company_id) ON CONFLICT DO NOTHING;
  RETURN NEW;
END
$$;
-- +goose StatementEnd

DROP TRIGGER coordinators_run_refs ON executor.coordinators;

-- +goose Down
CREATE TRIGGER coordinators_run_refs AFTER INSERT ON executor.coordinators
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION executor.check_run_refs();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION executor.company_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.company_id IS NULL THEN
    NEW.company_id := (SELECT r.company_id FROM executor.runs r WHERE r.run_id = NEW.run_id);
    IF NEW.company_id IS NULL THEN
      RAISE foreign_key_violation USING MESSAGE = format('coordinator of run %s, which is not in executor.runs', NEW.run_id);
    END IF;
  END IF;
  INSERT INTO executor.company_state (company_id) VALUES (NEW.company_id) ON CONFLICT DO NOTHING;
  RETURN NEW;
END
$$;
-- +goose StatementEnd
