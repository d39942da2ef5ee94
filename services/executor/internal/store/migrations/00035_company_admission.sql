-- +goose Up
-- SPEC Q1: admission of a submission against its company's limits.
-- A company's open runs (queued or in flight), for the counts a
-- submission of a limited company reads under the company's lock.
CREATE INDEX runs_company_open_idx ON executor.runs (company_id, lifecycle) WHERE ended_at IS NULL;

-- The guard every submission runs first, in its own transaction: it
-- raises SQLSTATE TQ001 when a limit applies to the submission (the
-- company's own row, or the default's), so that the submitter admits it
-- again under the company's lock (store/quota.go). Without one, a
-- submission costs one primary-key lookup more and no round trip.
-- +goose StatementBegin
CREATE FUNCTION executor.company_admission_guard(company text, warm boolean) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM (SELECT * FROM executor.company_limits WHERE company_id IN (company, '*')
                             ORDER BY company_id = '*' LIMIT 1) l
              WHERE l.max_queued_runs IS NOT NULL OR l.monthly_budget_usd IS NOT NULL
                 OR (warm AND l.max_warm_sessions IS NOT NULL)) THEN
    RAISE EXCEPTION 'company % has limits', company USING ERRCODE = 'TQ001';
  END IF;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION executor.company_admission_guard(text, boolean);
DROP INDEX executor.runs_company_open_idx;
