-- +goose Up
-- SPEC Q1 and Q3 in the claim: a company's runs in flight never exceed its
-- max_running_runs (company_limits, migration 00030), on any number of
-- replicas, and free slots go to the companies with due work in proportion
-- to their weights, whatever the size of one company's backlog.
--
-- company_state holds, per company that ever submitted:
--   pass            its virtual time for weighted round robin (stride
--                   scheduling): a claim of one of its runs while another
--                   company has due work too adds 1/weight; the claim serves
--                   the company with due work whose pass is least. A company
--                   coming back from idle starts at most 1 (one claim of a
--                   weight-1 company) behind the next company waiting, so an
--                   idle spell earns no burst.
--   budget_blocked  set while the company's monthly budget is exhausted
--                   (SPEC Q2): the claim starts none of its runs.
-- A claim of a company with a limit locks the company's row, then counts
-- its runs in flight (coordinators_company_running_idx, at most the limit
-- rows) in a statement that sees every claim committed before the lock was
-- granted: claims of one limited company are serialized, so replicas never
-- overshoot; claims of different companies, and of unlimited ones, are not.
ALTER TABLE executor.coordinators ADD COLUMN company_id text;
UPDATE executor.coordinators c SET company_id = r.company_id FROM executor.runs r WHERE r.run_id = c.run_id;
ALTER TABLE executor.coordinators ALTER COLUMN company_id SET NOT NULL;

CREATE TABLE executor.company_state (
    company_id     text PRIMARY KEY,
    pass           double precision NOT NULL DEFAULT 0,
    budget_blocked boolean NOT NULL DEFAULT false
);
INSERT INTO executor.company_state (company_id) SELECT DISTINCT company_id FROM executor.coordinators;

-- A company's due heads, oldest first: the claim's pick of a company's next
-- run is one probe, however many runs wait elsewhere.
CREATE INDEX coordinators_company_head_idx ON executor.coordinators (company_id, submit_seq)
    WHERE scope_head AND phase IN ('queued', 'retryable_failure');
DROP INDEX executor.coordinators_head_queue_idx;
-- A company's runs in flight (what its limit counts).
CREATE INDEX coordinators_company_running_idx ON executor.coordinators (company_id) WHERE phase = 'observed';

-- A coordinator names its run's company (a submission sets it; an insert
-- without it, as a release before 00031 makes, gets it here), and the
-- company has its state row.
-- +goose StatementBegin
CREATE FUNCTION executor.company_on_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER coordinators_company_insert BEFORE INSERT ON executor.coordinators
    FOR EACH ROW EXECUTE FUNCTION executor.company_on_insert();

-- take_slot: may the company start one more run in this transaction? Not
-- while its budget blocks it; with a max_running_runs (its row's, else the
-- '*' row's; NULL is none), only under it: the company's row is locked
-- (waiting for another claim of the company to commit) and its runs in
-- flight counted after the lock, held until this transaction ends.
-- +goose StatementBegin
CREATE FUNCTION executor.take_slot(p_company text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  v_max integer;
BEGIN
  SELECT l.max_running_runs INTO v_max FROM executor.company_limits l
   WHERE l.company_id IN (p_company, '*') ORDER BY l.company_id = '*' LIMIT 1;
  IF v_max IS NULL THEN
    RETURN NOT EXISTS (SELECT 1 FROM executor.company_state s WHERE s.company_id = p_company AND s.budget_blocked);
  END IF;
  PERFORM 1 FROM executor.company_state s WHERE s.company_id = p_company AND NOT s.budget_blocked FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  RETURN (SELECT count(*) FROM (SELECT 1 FROM executor.coordinators c
                                 WHERE c.company_id = p_company AND c.phase = 'observed' LIMIT v_max) n) < v_max;
END
$$;
-- +goose StatementEnd

-- claim_queued claims, for the lease given, the oldest due head of the
-- company next by weighted fair share among the companies with due work
-- that may start one more (take_slot, called for a company with a limit
-- only); nothing when none. Each statement in it reads the latest commits
-- (a function's own snapshots), so what it claims and what it returns are
-- the same rows. Only a claim made while another company has due work too
-- advances the company's pass (one company alone writes no state: its
-- claims are not serialized).
-- +goose StatementBegin
CREATE FUNCTION executor.claim_queued(p_owner text, p_ttl_us bigint, p_boot text, p_pid integer, p_ticks bigint, p_addr text, p_ns text)
RETURNS TABLE (o_run_id text, o_attempt bigint, o_lease_expires_at timestamptz, o_turn_generation bigint,
               o_input bytea, o_session_scope text, o_trace_parent text, o_created_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
  cand record;
BEGIN
  FOR cand IN
    SELECT s.company_id, coalesce(l.weight, 1) AS weight, l.max_running_runs IS NOT NULL AS limited,
           count(*) OVER () AS waiting, lead(s.pass) OVER (ORDER BY s.pass, s.company_id) AS next_pass
      FROM executor.company_state s
      LEFT JOIN LATERAL (SELECT cl.weight, cl.max_running_runs FROM executor.company_limits cl
                          WHERE cl.company_id IN (s.company_id, '*') ORDER BY cl.company_id = '*' LIMIT 1) l ON true
      -- Written as the first due head in submit_seq order, not EXISTS: that
      -- plans as a probe of coordinators_company_head_idx, whatever the
      -- statistics say.
      CROSS JOIN LATERAL (SELECT c.run_id FROM executor.coordinators c
                           WHERE c.company_id = s.company_id AND c.scope_head AND c.phase IN ('queued', 'retryable_failure')
                             AND c.next_attempt_at <= now() AND c.result_id IS NULL AND c.cancel_state IS NULL
                           ORDER BY c.submit_seq LIMIT 1) h
     WHERE NOT s.budget_blocked
     ORDER BY s.pass, s.company_id
  LOOP
    CONTINUE WHEN cand.limited AND NOT executor.take_slot(cand.company_id);
    RETURN QUERY
    WITH claimed AS (
      UPDATE executor.coordinators c
         SET attempt = c.attempt + 1, lease_owner = p_owner, lease_expires_at = now() + p_ttl_us * interval '1 microsecond',
             phase = 'observed', controller_boot_id = p_boot, controller_pid = p_pid, controller_start_ticks = p_ticks,
             started_at = coalesce(c.started_at, now()), controller_addr = nullif(p_addr, ''), controller_pid_ns = nullif(p_ns, '')
       WHERE c.run_id = (
         SELECT c2.run_id FROM executor.coordinators c2
          WHERE c2.company_id = cand.company_id AND c2.scope_head AND c2.phase IN ('queued', 'retryable_failure')
            AND c2.next_attempt_at <= now() AND c2.result_id IS NULL AND c2.cancel_state IS NULL
          ORDER BY c2.submit_seq LIMIT 1
          FOR UPDATE SKIP LOCKED)
      RETURNING c.run_id, c.attempt, c.lease_expires_at, c.turn_generation)
    SELECT claimed.run_id, claimed.attempt, claimed.lease_expires_at, claimed.turn_generation,
           r.input, r.session_scope, coalesce(r.trace_parent, ''), r.created_at
      FROM claimed JOIN executor.runs r ON r.run_id = claimed.run_id;
    CONTINUE WHEN NOT FOUND; -- its due heads are being claimed by others
    IF cand.waiting > 1 THEN
      UPDATE executor.company_state s SET pass = greatest(s.pass, cand.next_pass - 1) + 1.0 / cand.weight
       WHERE s.company_id = cand.company_id;
    END IF;
    RETURN;
  END LOOP;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION executor.claim_queued(text, bigint, text, integer, bigint, text, text);
DROP FUNCTION executor.take_slot(text);
DROP TRIGGER coordinators_company_insert ON executor.coordinators;
DROP FUNCTION executor.company_on_insert();
DROP INDEX executor.coordinators_company_running_idx;
CREATE INDEX coordinators_head_queue_idx ON executor.coordinators (submit_seq)
    WHERE scope_head AND phase IN ('queued', 'retryable_failure');
DROP INDEX executor.coordinators_company_head_idx;
DROP TABLE executor.company_state;
ALTER TABLE executor.coordinators DROP COLUMN company_id;
