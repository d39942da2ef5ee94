-- +goose Up
-- Run ids are unique per company (SPEC T2). runs.run_id stays the run's
-- internal key, unique across the fleet: events, leases, interactions,
-- placements, the gateway and runnerd all keep using it. client_run_id is
-- the id the submitting company chose, unique within that company; the API
-- resolves (caller's companies, client id) to the key and answers with the
-- client id. The key equals the client id unless that id was already a key
-- (another company's run): then the key is a fresh random one. Runs from
-- before keep their id as both.
ALTER TABLE executor.runs ADD COLUMN client_run_id text;
UPDATE executor.runs SET client_run_id = run_id;
ALTER TABLE executor.runs ALTER COLUMN client_run_id SET NOT NULL;
-- (client_run_id, company_id): a company's run by its id, and an
-- operator's lookup of an id across companies.
CREATE UNIQUE INDEX runs_client_run_id_idx ON executor.runs (client_run_id, company_id);

-- An insert that names no client id (an executor from before this
-- migration, during a rolling upgrade) keeps the run id as the client id.
-- +goose StatementBegin
CREATE FUNCTION executor.runs_client_run_id_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.client_run_id IS NULL THEN
    NEW.client_run_id := NEW.run_id;
  END IF;
  RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER runs_client_run_id_default BEFORE INSERT ON executor.runs
  FOR EACH ROW EXECUTE FUNCTION executor.runs_client_run_id_default();

-- +goose Down
DROP TRIGGER runs_client_run_id_default ON executor.runs;
DROP FUNCTION executor.runs_client_run_id_default();
DROP INDEX executor.runs_client_run_id_idx;
ALTER TABLE executor.runs DROP COLUMN client_run_id;
