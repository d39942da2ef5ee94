package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// Company limits (SPEC Q1–Q3, docs/limits.md). executor.company_limits
// holds one row per company with its own limits and the default row "*"
// (DefaultCompany) for every other company; they are read at each
// submission and claim, so a change is effective on every replica at once.
//
// Admission (Q1, Q2): every submission first runs the guard
// executor.company_admission_guard in its own transaction (one primary-key
// lookup, no round trip more): when a limit applies to it, the guard fails
// the transaction, nothing is stored, and the submission is admitted again
// in an explicit transaction under the company's advisory lock
// (admitLocked): the counts are read after the lock is held, the run's
// rules decide (Rules.Admit), and the run is inserted before the lock is
// released at commit. Submissions of one company are so serialized across
// every replica: no limit is overshot.

// Budget policies (company_limits.budget_policy).
const (
	BudgetPolicyFinishTurn = "finish_turn"
	BudgetPolicyCancel     = "cancel"
)

// CompanyLimits is a company's row of executor.company_limits (or the
// default's). A nil limit is no limit.
type CompanyLimits struct {
	// Company is a company id, or DefaultCompany.
	Company string
	// IsDefault: these are the default row's limits, read for a company
	// without its own.
	IsDefault        bool
	MaxRunningRuns   *int
	MaxWarmSessions  *int
	MaxQueuedRuns    *int
	Weight           int
	MonthlyBudgetUSD *float64
	BudgetWarnRatio  float64
	BudgetPolicy     string
	UpdatedAt        time.Time
	UpdatedBy        string
}

// Check refuses limits the table would refuse, with a readable message.
func (l CompanyLimits) Check() error {
	if l.Company == "" {
		return fmt.Errorf("company limits name a company (or %q for the default)", DefaultCompany)
	}
	for name, v := range map[string]*int{"max_running_runs": l.MaxRunningRuns, "max_warm_sessions": l.MaxWarmSessions, "max_queued_runs": l.MaxQueuedRuns} {
		if v != nil && *v < 0 {
			return fmt.Errorf("%s %d is negative", name, *v)
		}
	}
	if l.Weight < 1 || l.Weight > 1000 {
		return fmt.Errorf("weight %d is not within 1..1000", l.Weight)
	}
	if l.MonthlyBudgetUSD != nil && (*l.MonthlyBudgetUSD < 0 || *l.MonthlyBudgetUSD >= 1e8) {
		return fmt.Errorf("monthly budget %v is not within 0..1e8 USD", *l.MonthlyBudgetUSD)
	}
	if l.BudgetWarnRatio <= 0 || l.BudgetWarnRatio > 1 {
		return fmt.Errorf("budget warn ratio %v is not within (0, 1]", l.BudgetWarnRatio)
	}
	if l.BudgetPolicy != BudgetPolicyFinishTurn && l.BudgetPolicy != BudgetPolicyCancel {
		return fmt.Errorf("budget policy %q is neither %s nor %s", l.BudgetPolicy, BudgetPolicyFinishTurn, BudgetPolicyCancel)
	}
	return nil
}

// limitsColumns are scanLimits' columns of a company_limits row l.
const limitsColumns = `l.company_id, l.max_running_runs, l.max_warm_sessions, l.max_queued_runs, l.weight,
  l.monthly_budget_usd::float8, l.budget_warn_ratio::float8, l.budget_policy, l.updated_at, l.updated_by`

// effectiveLimitsSQL is the row that applies to company $1: its own, or
// the default's.
const effectiveLimitsSQL = `(SELECT * FROM executor.company_limits WHERE company_id IN ($1, '*') ORDER BY company_id = '*' LIMIT 1)`

func scanLimits(row pgx.Row, more ...any) (CompanyLimits, error) {
	var (
		l                     CompanyLimits
		running, warm, queued *int32
	)
	err := row.Scan(append([]any{&l.Company, &running, &warm, &queued, &l.Weight, &l.MonthlyBudgetUSD,
		&l.BudgetWarnRatio, &l.BudgetPolicy, &l.UpdatedAt, &l.UpdatedBy}, more...)...)
	l.MaxRunningRuns, l.MaxWarmSessions, l.MaxQueuedRuns = intPtr(running), intPtr(warm), intPtr(queued)
	l.IsDefault = l.Company == DefaultCompany
	return l, err
}

func intPtr(v *int32) *int {
	if v == nil {
		return nil
	}
	n := int(*v)
	return &n
}

// CompanyLimits returns the limits that apply to company: its own, or the
// default's (IsDefault). DefaultCompany reads the default.
func (s *Store) CompanyLimits(ctx context.Context, company string) (CompanyLimits, error) {
	return scanLimits(s.pool.QueryRow(ctx, `SELECT `+limitsColumns+` FROM `+effectiveLimitsSQL+` l`, company))
}

// SetCompanyLimits stores a company's limits (or the default's), every
// field, and records the change in the operator audit (company_limits.set,
// with the new values), in one transaction.
func (s *Store) SetCompanyLimits(ctx context.Context, l CompanyLimits, by, reason string) (CompanyLimits, error) {
	if err := l.Check(); err != nil {
		return CompanyLimits{}, failure.New(codes.InvalidArgument, failure.InvalidRequest, "%v", err)
	}
	var out CompanyLimits
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) (err error) {
		out, err = scanLimits(tx.QueryRow(ctx, `
INSERT INTO executor.company_limits AS l (company_id, max_running_runs, max_warm_sessions, max_queued_runs, weight,
       monthly_budget_usd, budget_warn_ratio, budget_policy, updated_by)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (company_id) DO UPDATE SET max_running_runs = EXCLUDED.max_running_runs, max_warm_sessions = EXCLUDED.max_warm_sessions,
       max_queued_runs = EXCLUDED.max_queued_runs, weight = EXCLUDED.weight, monthly_budget_usd = EXCLUDED.monthly_budget_usd,
       budget_warn_ratio = EXCLUDED.budget_warn_ratio, budget_policy = EXCLUDED.budget_policy,
       updated_by = EXCLUDED.updated_by, updated_at = now()
RETURNING `+limitsColumns, l.Company, l.MaxRunningRuns, l.MaxWarmSessions, l.MaxQueuedRuns, l.Weight,
			l.MonthlyBudgetUSD, l.BudgetWarnRatio, l.BudgetPolicy, by))
		if err != nil {
			return err
		}
		return recordOperatorAction(ctx, tx, OperatorAction{Action: "company_limits.set", Principal: by, Company: l.Company, Reason: reason,
			Details: map[string]any{"max_running_runs": l.MaxRunningRuns, "max_warm_sessions": l.MaxWarmSessions,
				"max_queued_runs": l.MaxQueuedRuns, "weight": l.Weight, "monthly_budget_usd": l.MonthlyBudgetUSD,
				"budget_warn_ratio": l.BudgetWarnRatio, "budget_policy": l.BudgetPolicy}})
	})
	return out, err
}

// Admission is what the run's rules decide a submission on (Rules.Admit):
// the company's limits and what it uses, read under the company's lock.
type Admission struct {
	Company string
	Limits  CompanyLimits
	// Warm: the run is of a warm session (lifecycle warm).
	Warm bool
	// OpensSession: the run's scope has no warm session open or about to
	// open; the run would open one more.
	OpensSession bool
	// QueuedRuns are the company's runs waiting to start (queued, or
	// waiting for a retry), WarmSessions its warm sessions open or about
	// to open (a scope whose newest warm run has not ended, or ended and
	// was not suspended since).
	QueuedRuns   int
	WarmSessions int
	// MonthSpendUSD is the company's settled spend of the current month
	// (the store's clock), SPEC Q2.
	MonthSpendUSD float64
}

// guardSQL is the first statement of every submission (see above). The
// guard's condition is evaluated here in plain SQL, the same as the
// function's, and the function (which evaluates it again and raises) is
// called only when a limit applies: a PL/pgSQL call costs the database
// several times the primary-key probe, and every submission of a company
// without limits paid it (SPEC P1). Before migration 00035 the function
// is missing and the statement fails as before (guardMissing).
const guardSQL = `SELECT CASE WHEN EXISTS (
  SELECT FROM (SELECT * FROM executor.company_limits WHERE company_id IN ($1, '*') ORDER BY company_id = '*' LIMIT 1) l
   WHERE l.max_queued_runs IS NOT NULL OR l.monthly_budget_usd IS NOT NULL OR ($2 AND l.max_warm_sessions IS NOT NULL))
  THEN executor.company_admission_guard($1, $2) END`

// sqlstateLimited is the guard's SQLSTATE.
const sqlstateLimited = "TQ001"

// limitedErr reports whether err is the guard's: the submission is
// admitted again under the company's lock.
func limitedErr(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateLimited
}

// guardMissing reports whether err is the database's refusal of the guard
// itself: a schema before migration 00035.
func guardMissing(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42883" && strings.Contains(pgErr.Message, "company_admission_guard")
}

// warmLifecycle is runs.lifecycle of a warm session's run.
const warmLifecycle = "LIFECYCLE_MODE_WARM"

// liveWarmScopeSQL is true for a run r that keeps its warm scope open:
// not ended, or the scope's newest run, ended within idleHorizon and
// neither suspended (nor skipped) nor closed (CloseSession) since.
const liveWarmScopeSQL = `(r.ended_at IS NULL OR (r.ended_at > now() - make_interval(secs => ` + idleHorizonSecs + `)
   AND NOT EXISTS (SELECT 1 FROM executor.runs n WHERE n.session_scope = r.session_scope AND n.submit_seq > r.submit_seq)
   AND NOT EXISTS (SELECT 1 FROM executor.session_suspensions s
                    WHERE s.session_scope = r.session_scope AND s.last_run_id = r.run_id AND s.state IN ('suspended', 'skipped'))
   AND NOT EXISTS (SELECT 1 FROM executor.session_closes k WHERE k.session_scope = r.session_scope AND k.last_run_id = r.run_id)))`

const idleHorizonSecs = "172800"

// admissionSQL reads a submission's Admission facts ($1 company, $2 the
// run's client id, $3 its scope), and whether the company has a run of
// that client id already (a resubmission, never refused).
var admissionSQL = `SELECT ` + limitsColumns + `,
  EXISTS (SELECT 1 FROM executor.runs WHERE client_run_id = $2 AND company_id = $1),
  (SELECT count(*) FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
    WHERE r.company_id = $1 AND r.ended_at IS NULL AND c.phase IN ('queued', 'retryable_failure')),
  (SELECT count(DISTINCT r.session_scope) FROM executor.runs r
    WHERE r.company_id = $1 AND r.lifecycle = '` + warmLifecycle + `' AND r.session_scope <> $3 AND ` + liveWarmScopeSQL + `),
  EXISTS (SELECT 1 FROM executor.runs r
    WHERE r.session_scope = $3 AND r.company_id = $1 AND r.lifecycle = '` + warmLifecycle + `' AND ` + liveWarmScopeSQL + `),
  ` + monthSpendSQL("$4") + `
  FROM ` + effectiveLimitsSQL + ` l`

// monthSpendSQL is company $1's spend of the month given by the
// parameter month (a date).
func monthSpendSQL(month string) string {
	return `coalesce((SELECT spend_usd::float8 FROM executor.company_spend WHERE company_id = $1 AND month = ` + month + `), 0)`
}

// companyLockSQL serializes the admissions of company $1 (every replica),
// until the transaction ends.
const companyLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('executor.company:' || $1, 0))`

// admitLocked runs a limited submission in an explicit transaction: the
// company's lock, the facts read after it, the rules' decision, then
// send (the submission's statements, without the guard) before the
// commit releases the lock.
func (s *Store) admitLocked(ctx context.Context, company, clientID, scope string, warm bool, send func(tx pgx.Tx) error) error {
	rules, err := s.decider()
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, companyLockSQL, company); err != nil {
			return err
		}
		a := Admission{Company: company, Warm: warm}
		var (
			resubmit bool
			live     bool
		)
		a.Limits, err = scanLimits(tx.QueryRow(ctx, admissionSQL, company, clientID, scope, s.Month()),
			&resubmit, &a.QueuedRuns, &a.WarmSessions, &live, &a.MonthSpendUSD)
		if err != nil {
			return err
		}
		a.OpensSession = warm && !live
		if !resubmit {
			if err := rules.Admit(a); err != nil {
				return err
			}
		}
		return send(tx)
	})
}

// CompanyUsage is what a company uses now (SPEC Q4).
type CompanyUsage struct {
	Company      string
	RunningRuns  int
	QueuedRuns   int
	WarmSessions int
	Limits       CompanyLimits
	// Month is the current month (the store's clock), SpendUSD the
	// company's settled spend in it.
	Month    time.Time
	SpendUSD float64
	// Refused counts the submissions refused, by reason.
	Refused map[string]int64
}

// companyUsageSQL reads a company's usage ($1).
var companyUsageSQL = `SELECT ` + limitsColumns + `,
  (SELECT count(*) FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
    WHERE r.company_id = $1 AND r.ended_at IS NULL AND c.phase = 'observed'),
  (SELECT count(*) FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
    WHERE r.company_id = $1 AND r.ended_at IS NULL AND c.phase IN ('queued', 'retryable_failure')),
  (SELECT count(DISTINCT r.session_scope) FROM executor.runs r
    WHERE r.company_id = $1 AND r.lifecycle = '` + warmLifecycle + `' AND ` + liveWarmScopeSQL + `),
  ` + monthSpendSQL("$2") + `,
  (SELECT coalesce(jsonb_object_agg(reason, refused), '{}') FROM executor.company_refusals WHERE company_id = $1)
  FROM ` + effectiveLimitsSQL + ` l`

// CompanyUsage reads what company uses now against its limits.
func (s *Store) CompanyUsage(ctx context.Context, company string) (CompanyUsage, error) {
	u := CompanyUsage{Company: company, Month: s.Month()}
	var err error
	u.Limits, err = scanLimits(s.pool.QueryRow(ctx, companyUsageSQL, company, u.Month),
		&u.RunningRuns, &u.QueuedRuns, &u.WarmSessions, &u.SpendUSD, &u.Refused)
	return u, err
}

// refusalReasons are the refusals of a submission counted per company
// (SPEC Q4).
var refusalReasons = map[failure.Reason]bool{failure.QuotaQueuedRuns: true, failure.QuotaWarmSessions: true, failure.BudgetExhausted: true}

// countRefusal counts a submission of company refused by err, if it was a
// limit's or the budget's refusal (best effort: a failed count does not
// change the caller's answer).
func (s *Store) countRefusal(ctx context.Context, company string, err error) {
	reason := failure.CodeOf(err)
	if !refusalReasons[reason] {
		return
	}
	_, _ = s.pool.Exec(ctx, `INSERT INTO executor.company_refusals AS r (company_id, reason, refused) VALUES ($1, $2, 1)
ON CONFLICT (company_id, reason) DO UPDATE SET refused = r.refused + 1, updated_at = now()`, company, string(reason))
}
