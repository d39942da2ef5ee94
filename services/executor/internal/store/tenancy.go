package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// RunCompany returns the company of a run, or the run_not_found error
// GetRun answers for a missing run (SPEC T2: a run of another company
// answers exactly as a missing one).
func (s *Store) RunCompany(ctx context.Context, runID string) (string, error) {
	var company string
	err := s.pool.QueryRow(ctx, `SELECT company_id FROM executor.runs WHERE run_id = $1`, runID).Scan(&company)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", ErrRunNotFound(runID)
	}
	return company, err
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
