package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// RunRef is a run as a caller names it (SPEC T2: run ids are unique per
// company): the id the company chose, optionally the company, and the
// companies the caller may read.
type RunRef struct {
	// ID is the run id the submitting company chose (runs.client_run_id).
	ID string
	// Company, when set, is the company the caller names (company_id of a
	// run-addressed request): only its run is found.
	Company string
	// Companies, when not nil, are the companies the caller may read: a
	// run of another one is not found. Nil: every company (an operator,
	// or loopback development mode).
	Companies []string
}

// ResolvedRun is a run found by its RunRef.
type ResolvedRun struct {
	// Key is the run's internal key (runs.run_id): what events, leases,
	// interactions, the gateway and runnerd know it by.
	Key string
	// Company is the run's company.
	Company string
}

// resolveRunSQL finds the runs a RunRef may name (at most two: more than
// one is ambiguous).
const resolveRunSQL = `SELECT run_id, company_id FROM executor.runs
 WHERE client_run_id = $1 AND ($2 = '' OR company_id = $2) AND ($3::text[] IS NULL OR company_id = ANY($3))
 ORDER BY company_id LIMIT 2`

// ResolveRun finds the run a caller names: run_not_found when none of the
// companies it may read has a run of that id (a run of another company
// answers exactly as a missing one), run_id_ambiguous when more than one
// has and the caller named no company.
func (s *Store) ResolveRun(ctx context.Context, ref RunRef) (ResolvedRun, error) {
	rows, err := s.pool.Query(ctx, resolveRunSQL, ref.ID, ref.Company, companiesArg(ref.Companies))
	if err != nil {
		return ResolvedRun{}, err
	}
	var found []ResolvedRun
	for rows.Next() {
		var r ResolvedRun
		if err := rows.Scan(&r.Key, &r.Company); err != nil {
			rows.Close()
			return ResolvedRun{}, err
		}
		found = append(found, r)
	}
	if err := rows.Err(); err != nil {
		return ResolvedRun{}, err
	}
	switch len(found) {
	case 0:
		return ResolvedRun{}, ErrRunNotFound(ref.ID)
	case 1:
		return found[0], nil
	}
	return ResolvedRun{}, ErrRunAmbiguous(ref.ID)
}

// ErrRunAmbiguous is the run_id_ambiguous error of a run id more than one
// of the caller's companies uses, named without company_id (SPEC T2).
func ErrRunAmbiguous(id string) error {
	return failure.New(codes.FailedPrecondition, failure.RunIDAmbiguous,
		"run id %q is used by more than one company you can read: name the run's company_id", id)
}

// InteractionCompany returns the company of an interaction, or the
// interaction_not_found error GetInteraction answers for a missing one.
func (s *Store) InteractionCompany(ctx context.Context, id string) (string, error) {
	var company string
	err := s.pool.QueryRow(ctx, `SELECT company_id FROM executor.interactions WHERE interaction_id = $1`, id).Scan(&company)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", errInteractionNotFound(id)
	}
	return company, err
}

// companiesArg is a list filter's companies as a query argument: NULL (no
// filter) for nil, an array (possibly empty: nothing matches) otherwise.
func companiesArg(companies []string) any {
	if companies == nil {
		return nil
	}
	return companies
}

type actorKey struct{}

type clientRunIDKey struct{}

// WithClientRunID returns ctx naming the id the submitting company chose
// for a run Submit and SubmitClaim store under another key (SPEC T2: the
// key is a fresh one when the id is another company's run's key). Without
// it the run's key is its client id.
func WithClientRunID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, clientRunIDKey{}, id)
}

func clientRunID(ctx context.Context, key string) string {
	if id, _ := ctx.Value(clientRunIDKey{}).(string); id != "" {
		return id
	}
	return key
}

// NewRunKey is a fresh internal run key, for a run whose client id is
// another run's key already: "run-" and 24 random hex digits (a valid run
// id, well within the gateway's bounds).
func NewRunKey() string { return newID("run-") }

// WithActor returns ctx naming the principal a write is recorded for
// (SPEC T2: runs.submitted_by, interactions.answered_by,
// gateways.drain_requested_by), as the API's authorizer named it.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorOf is the principal WithActor named ("" when none).
func ActorOf(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// ErrInteractionNotFound is the interaction_not_found error of id.
func ErrInteractionNotFound(id string) error { return errInteractionNotFound(id) }
