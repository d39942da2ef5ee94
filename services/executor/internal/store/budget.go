package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Budgets (SPEC Q2, docs/limits.md). A company's spend is the sum of the
// settled costs (E1) of its runs per calendar month, UTC, in
// executor.company_spend (migration 00036): a run's cost is added in the
// transaction that settles it, once (runs.spend_month is the key). Which
// month it is has one owner, the store's clock (Month; SetClock in tests):
// the month a settlement adds to is the one a submission's admission, the
// usage, the metrics and the budget sweep read.

// BudgetState is where a month's spend stands against the budget.
type BudgetState int

// Budget states, in order.
const (
	// BudgetOK: no budget, or below its warn ratio.
	BudgetOK BudgetState = iota
	// BudgetWarning: at or over the warn ratio, below the budget.
	BudgetWarning
	// BudgetExhausted: at or over the budget.
	BudgetExhausted
)

func (b BudgetState) String() string {
	return [...]string{"ok", "warning", "exhausted"}[b]
}

// SetClock sets the clock the store reads the current month from (default
// time.Now). Set it before the store is used.
func (s *Store) SetClock(now func() time.Time) { s.clock = now }

// Month is the current calendar month (UTC) by the store's clock: the
// month settlements add to and admission, usage, metrics and the budget
// sweep read.
func (s *Store) Month() time.Time { return MonthOf(s.now()) }

func (s *Store) now() time.Time {
	if s.clock == nil {
		return time.Now()
	}
	return s.clock()
}

// MonthOf is the calendar month (UTC) of t, as its first day.
func MonthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// settleSpendSQL adds the cost of the run $1, just settled in this
// transaction, to its company's spend of the month $2 (the store's clock,
// like every other reader of the month), unless it was added already; it
// returns the month's spend with the company's budget.
const settleSpendSQL = `
WITH r AS (
  UPDATE executor.runs SET spend_month = $2::date
   WHERE run_id = $1 AND spend_month IS NULL AND cost_usd > 0
  RETURNING company_id, cost_usd, spend_month),
s AS (
  INSERT INTO executor.company_spend AS s (company_id, month, spend_usd, runs)
  SELECT company_id, spend_month, cost_usd, 1 FROM r
  ON CONFLICT (company_id, month) DO UPDATE SET spend_usd = s.spend_usd + EXCLUDED.spend_usd, runs = s.runs + 1, updated_at = now()
  RETURNING company_id, month, spend_usd::float8 AS spend, warned_at IS NOT NULL AS warned, exhausted_at IS NOT NULL AS exhausted)
SELECT ` + limitsColumns + `, s.company_id, s.spend, s.warned, s.exhausted, s.month
  FROM s, LATERAL (SELECT * FROM executor.company_limits WHERE company_id IN (s.company_id, '*') ORDER BY company_id = '*' LIMIT 1) l`

// settled is what settleSpendSQL returned (ok: a cost was added); month
// is set before: the month to settle into.
type settled struct {
	queued            bool // queueSettle queued its statement
	ok                bool
	company           string
	spend             float64
	warned, exhausted bool
	limits            CompanyLimits
	month             time.Time
}

// queueSettle queues the spend of a run whose terminal carries a cost.
func queueSettle(b *pgx.Batch, runID string, into *settled) {
	into.queued = true
	b.Queue(settleSpendSQL, runID, into.month).QueryRow(func(row pgx.Row) error {
		var err error
		into.limits, err = scanLimits(row, &into.company, &into.spend, &into.warned, &into.exhausted, &into.month)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		into.ok = err == nil
		return err
	})
}

// crossBudget records, in the settling transaction, the thresholds the
// month's spend crossed for the first time this month (the rules decide
// where it stands).
func crossBudget(ctx context.Context, tx pgx.Tx, rules Rules, st *settled) error {
	if !st.ok || rules == nil {
		return nil
	}
	return recordThresholds(ctx, tx, rules.Budget(st.spend, st.limits), st.company, st.month, st.spend, st.limits, st.warned, st.exhausted)
}

// recordThresholds records budget.warning and budget.exhausted for the
// company's month, each once a month (company_spend.warned_at /
// exhausted_at, set only while empty) with an operator_actions row, when
// state reached it and warned / exhausted do not say it was recorded
// already. A settlement that crosses a threshold records it
// (crossBudget), and so does the budget sweep when the budget was lowered
// under the month's spend (RecordBudgetThresholds).
func recordThresholds(ctx context.Context, tx pgx.Tx, state BudgetState, company string, month time.Time, spend float64,
	limits CompanyLimits, warned, exhausted bool) error {
	for _, c := range []struct {
		at     BudgetState
		done   bool
		column string
		action string
	}{{BudgetWarning, warned, "warned_at", "budget.warning"}, {BudgetExhausted, exhausted, "exhausted_at", "budget.exhausted"}} {
		if state < c.at || c.done {
			continue
		}
		tag, err := tx.Exec(ctx, `UPDATE executor.company_spend SET `+c.column+` = now()
 WHERE company_id = $1 AND month = $2 AND `+c.column+` IS NULL`, company, month)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			continue
		}
		if err := recordOperatorAction(ctx, tx, OperatorAction{Action: c.action, Principal: "executor", Company: company,
			Details: map[string]any{"month": month.Format("2006-01"), "spend_usd": spend,
				"monthly_budget_usd": limits.MonthlyBudgetUSD, "budget_warn_ratio": limits.BudgetWarnRatio}}); err != nil {
			return err
		}
	}
	return nil
}

// RecordBudgetThresholds records the thresholds b's month's spend stands
// at (state) that are not recorded yet (b.Warned, b.Exhausted), in one
// transaction; a concurrent settlement or another replica's sweep records
// each at most once all the same.
func (s *Store) RecordBudgetThresholds(ctx context.Context, b CompanyBudget, month time.Time, state BudgetState) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return recordThresholds(ctx, tx, state, b.Company, month, b.SpendUSD, b.Limits, b.Warned, b.Exhausted)
	})
}

// CompanyBudget is a company's month as the budget sweep sees it.
type CompanyBudget struct {
	Company  string
	SpendUSD float64
	Limits   CompanyLimits
	// Blocked: the claim starts none of its runs (company_state.budget_blocked).
	Blocked bool
	// Warned, Exhausted: budget.warning / budget.exhausted are recorded
	// for the month.
	Warned, Exhausted bool
}

// BudgetCompanies lists the companies with a settled spend in month, and
// those blocked now (a new month, or a raised budget, unblocks them), with
// their spend in month and limits.
func (s *Store) BudgetCompanies(ctx context.Context, month time.Time) ([]CompanyBudget, error) {
	rows, err := s.pool.Query(ctx, `
WITH c AS (
  SELECT company_id FROM executor.company_spend WHERE month = $1
  UNION SELECT company_id FROM executor.company_state WHERE budget_blocked)
SELECT `+limitsColumns+`, c.company_id,
       coalesce((SELECT spend_usd::float8 FROM executor.company_spend sp WHERE sp.company_id = c.company_id AND sp.month = $1), 0),
       coalesce((SELECT budget_blocked FROM executor.company_state st WHERE st.company_id = c.company_id), false),
       coalesce((SELECT warned_at IS NOT NULL FROM executor.company_spend sp WHERE sp.company_id = c.company_id AND sp.month = $1), false),
       coalesce((SELECT exhausted_at IS NOT NULL FROM executor.company_spend sp WHERE sp.company_id = c.company_id AND sp.month = $1), false)
  FROM c, LATERAL (SELECT * FROM executor.company_limits WHERE company_id IN (c.company_id, '*') ORDER BY company_id = '*' LIMIT 1) l
 ORDER BY c.company_id`, month)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CompanyBudget, error) {
		var b CompanyBudget
		var err error
		b.Limits, err = scanLimits(r, &b.Company, &b.SpendUSD, &b.Blocked, &b.Warned, &b.Exhausted)
		return b, err
	})
}

// SetBudgetBlocked sets whether the claim starts runs of company (SPEC Q2:
// blocked while its budget is exhausted).
func (s *Store) SetBudgetBlocked(ctx context.Context, company string, blocked bool) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO executor.company_state AS s (company_id, budget_blocked) VALUES ($1, $2)
ON CONFLICT (company_id) DO UPDATE SET budget_blocked = EXCLUDED.budget_blocked`, company, blocked)
	return err
}

// OpenRuns lists the keys of a company's runs that have not ended and are
// not being cancelled (at most limit, oldest first).
func (s *Store) OpenRuns(ctx context.Context, company string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT r.run_id FROM executor.runs r
 WHERE r.company_id = $1 AND r.ended_at IS NULL AND r.result_metadata -> 'nativeCancellation' IS NULL
 ORDER BY r.submit_seq LIMIT $2`, company, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// OtherCompanies is the metrics label of every company without its own
// company_limits row (SPEC Q4: the label's values are bounded by the
// operators' rows, whatever the number of companies).
const OtherCompanies = "_other"

// CompanyFigures are a metrics label's figures: a company with its own
// limits, or OtherCompanies summed.
type CompanyFigures struct {
	Label          string
	Running        int64
	Queued         int64
	SpendUSD       float64
	BudgetWarnings int64
	// Refused counts refused submissions by reason.
	Refused map[string]int64
}

// labelSQL is the metrics label of company column col.
func labelSQL(col string) string {
	return `CASE WHEN EXISTS (SELECT 1 FROM executor.company_limits l WHERE l.company_id = ` + col + ` AND l.company_id <> '*') THEN ` + col + ` ELSE '` + OtherCompanies + `' END`
}

// CompanyFiguresOf reads every label's figures: runs running and queued
// now, the spend of month, the budget warnings ever recorded, the refused
// submissions (fleet-wide: every replica reads the same).
func (s *Store) CompanyFiguresOf(ctx context.Context, month time.Time) ([]CompanyFigures, error) {
	rows, err := s.pool.Query(ctx, `
WITH open AS (
  SELECT `+labelSQL("r.company_id")+` AS label,
         count(*) FILTER (WHERE c.phase = 'observed') AS running,
         count(*) FILTER (WHERE c.phase IN ('queued', 'retryable_failure')) AS queued
    FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
   WHERE r.ended_at IS NULL GROUP BY 1),
spend AS (
  SELECT `+labelSQL("sp.company_id")+` AS label,
         sum(spend_usd) FILTER (WHERE month = $1) AS spend, count(warned_at) AS warnings
    FROM executor.company_spend sp GROUP BY 1),
refused AS (
  SELECT label, jsonb_object_agg(reason, n) AS refused FROM (
    SELECT `+labelSQL("f.company_id")+` AS label, reason, sum(refused) AS n FROM executor.company_refusals f GROUP BY 1, 2) x
   GROUP BY label),
labels AS (SELECT company_id AS label FROM executor.company_limits WHERE company_id <> '*' UNION SELECT '`+OtherCompanies+`')
SELECT labels.label, coalesce(open.running, 0), coalesce(open.queued, 0), coalesce(spend.spend, 0)::float8,
       coalesce(spend.warnings, 0), coalesce(refused.refused, '{}')
  FROM labels LEFT JOIN open USING (label) LEFT JOIN spend USING (label) LEFT JOIN refused USING (label)
 ORDER BY 1`, month)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CompanyFigures, error) {
		var f CompanyFigures
		err := r.Scan(&f.Label, &f.Running, &f.Queued, &f.SpendUSD, &f.BudgetWarnings, &f.Refused)
		return f, err
	})
}
