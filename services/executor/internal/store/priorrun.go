package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
)

// MaxPriorRuns caps how many records PriorRuns returns.
const MaxPriorRuns = 64

// PriorRunRecord is the database's record of a run whose durable identity a
// later run of the session may find on disk (SPEC E13): the evidence the
// durable authority verifies a continuation against.
type PriorRunRecord struct {
	RunID string
	// Status is the caller-facing run state (queued, running, succeeded,
	// failed, cancelled).
	Status string
	// Terminal is true when the run row stores a terminal outcome
	// (succeeded, failed, cancelled): no controller can still drive it.
	Terminal bool
	// Input is the run's persisted execution input; nil when none was
	// persisted.
	Input *prpv1.ExecutionInput
	// NeverServed: terminal, and no runner ever served the run (it ran no
	// turn; durable.PriorRun.NeverServed).
	NeverServed bool
	// RunnerInstanceID is the runner that served the run; empty when none.
	RunnerInstanceID string
}

// Proto is the record as the gateway receives it.
func (r PriorRunRecord) Proto() *gatewayv1.PriorRun {
	return &gatewayv1.PriorRun{RunId: r.RunID, Status: r.Status, Terminal: r.Terminal, Input: r.Input, NeverServed: r.NeverServed,
		RunnerInstanceId: r.RunnerInstanceID}
}

// Durable is the record as the durable authority verifies it (the same
// conversion the gateway applies to the proto).
func (r PriorRunRecord) Durable() durable.PriorRun {
	d := durable.PriorRunFromInput(r.RunID, r.Status, r.Terminal, r.Input)
	d.NeverServed = r.NeverServed
	return d
}

// PriorRunsProto converts records for the wire, in order.
func PriorRunsProto(records []PriorRunRecord) []*gatewayv1.PriorRun {
	out := make([]*gatewayv1.PriorRun, len(records))
	for i, r := range records {
		out[i] = r.Proto()
	}
	return out
}

// PriorRunLookupOf is a lookup over records read already (e.g. by
// PriorRuns); a run id not among them is unknown.
func PriorRunLookupOf(records []PriorRunRecord) durable.PriorRunLookup {
	conv := make([]durable.PriorRun, len(records))
	for i, r := range records {
		conv[i] = r.Durable()
	}
	return durable.PriorRunsOf(conv...)
}

// PriorRunLookup is a lookup that reads each run id's row from the database
// when asked: no row is an unknown run (nil), and a database failure is an
// error, which the durable authority treats as unavailable (the root is left
// untouched).
func (s *Store) PriorRunLookup() durable.PriorRunLookup {
	return func(ctx context.Context, runID string) (*durable.PriorRun, error) {
		rec, err := s.PriorRun(ctx, runID)
		if err != nil || rec == nil {
			return nil, err
		}
		r := rec.Durable()
		return &r, nil
	}
}

// priorRunSelect reads PriorRunRecord columns; a run without a coordinator
// row is reported by its stored state alone.
const priorRunSelect = `SELECT r.run_id, ` + stateExpr + `, r.input, coalesce(r.runner_instance_id, '')
  FROM executor.runs r LEFT JOIN executor.coordinators c ON c.run_id = r.run_id`

func scanPriorRun(row pgx.Row) (*PriorRunRecord, error) {
	var (
		rec PriorRunRecord
		raw []byte
	)
	if err := row.Scan(&rec.RunID, &rec.Status, &raw, &rec.RunnerInstanceID); err != nil {
		return nil, err
	}
	rec.Terminal = isTerminalState(rec.Status)
	rec.NeverServed = rec.Terminal && rec.RunnerInstanceID == ""
	if len(raw) > 0 {
		rec.Input = &prpv1.ExecutionInput{}
		if err := proto.Unmarshal(raw, rec.Input); err != nil {
			return nil, fmt.Errorf("run %s: persisted execution input: %w", rec.RunID, err)
		}
	}
	return &rec, nil
}

// PriorRun returns the record of run runID, or nil when there is no such
// run.
func (s *Store) PriorRun(ctx context.Context, runID string) (*PriorRunRecord, error) {
	rec, err := scanPriorRun(s.pool.QueryRow(ctx, priorRunSelect+` WHERE r.run_id = $1`, runID))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	return rec, err
}

// priorRunsSQL reads the prior runs of a run's company, agent and session
// (see PriorRuns; arguments from priorRunsArgs) in bounded probes: the
// named session's newest runs in index order (runs_prior_session_idx), the
// one run whose unnamed session it is, and the newest run each of the
// scope's newest runners served (scope_runners, then runs_session_idx):
// the run a root that runner left names (SPEC E13, F8, F9). A host that
// returns after more runs of the scope than the limit ended without a
// runner (they waited for it, or failed before an attach) holds a root
// naming a run older than every one of the newest; without that record
// the gateway found the root's run unknown and quarantined the root.
const priorRunsSQL = `
SELECT r.run_id, ` + stateExpr + `, r.input, coalesce(r.runner_instance_id, '')
  FROM (
        (SELECT run_id FROM executor.runs
          WHERE company_id = $1 AND agent_id = $2 AND normalized_session_id = $3 AND run_id <> $5
          ORDER BY submit_seq DESC LIMIT $6)
        UNION
        (SELECT run_id FROM executor.runs
          WHERE run_id = $4 AND run_id <> $5 AND normalized_session_id = '' AND company_id = $1 AND agent_id = $2)
        UNION
        (SELECT n.run_id
           FROM (SELECT last_submit_seq FROM executor.scope_runners WHERE session_scope = $7
                  ORDER BY last_submit_seq DESC LIMIT $8) s
           JOIN executor.runs n ON n.session_scope = $7 AND n.submit_seq = s.last_submit_seq
          WHERE n.run_id <> $5)
       ) m
  JOIN executor.runs r ON r.run_id = m.run_id
  LEFT JOIN executor.coordinators c ON c.run_id = r.run_id
 ORDER BY r.submit_seq DESC`

// priorRunners bounds the scope's runners whose newest run the prior runs
// include besides the newest runs (priorRunsSQL).
const priorRunners = 4

// priorRunsArgs are priorRunsSQL's arguments for run runID of company and
// agent in the stored normalized session (an unnamed session is
// "session-<run id>") and session scope sc; limit is clamped to
// 1..MaxPriorRuns.
func priorRunsArgs(runID, company, agent, session, sc string, limit int) []any {
	if limit <= 0 || limit > MaxPriorRuns {
		limit = MaxPriorRuns
	}
	session = scope.Params{RunID: runID, NormalizedSessionID: session}.SessionID()
	// The run (if any) whose unnamed session this is.
	unnamedOwner := ""
	if rest, ok := strings.CutPrefix(session, "session-"); ok {
		unnamedOwner = rest
	}
	return []any{company, agent, session, unnamedOwner, runID, limit, sc, priorRunners}
}

// scanPriorRuns reads priorRunsSQL's rows.
func scanPriorRuns(rows pgx.Rows) ([]PriorRunRecord, error) {
	defer rows.Close()
	var out []PriorRunRecord
	for rows.Next() {
		rec, err := scanPriorRun(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *rec)
	}
	return out, rows.Err()
}

// PriorRuns returns the records of the other runs of run runID's company,
// agent and normalized session id (an unnamed session is "session-<run
// id>"), newest first, at most limit (MaxPriorRuns when limit is not in
// 1..MaxPriorRuns), and besides them the newest run each of the run's
// scope's newest runners served (priorRunsSQL), in the same order. Runs of
// other companies or agents sharing the session id are never included. An
// unknown runID is run_not_found.
func (s *Store) PriorRuns(ctx context.Context, runID string, limit int) ([]PriorRunRecord, error) {
	var company, agent, session, sc string
	err := s.pool.QueryRow(ctx, `SELECT company_id, agent_id, normalized_session_id, session_scope FROM executor.runs WHERE run_id = $1`, runID).
		Scan(&company, &agent, &session, &sc)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrRunNotFound(runID)
	}
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, priorRunsSQL, priorRunsArgs(runID, company, agent, session, sc, limit)...)
	if err != nil {
		return nil, err
	}
	return scanPriorRuns(rows)
}
