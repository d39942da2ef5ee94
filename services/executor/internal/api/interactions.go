package api

import (
	"context"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/runtimeq"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// ListInteractions lists durable interactions, newest first.
func (s *Server) ListInteractions(ctx context.Context, req *executorv1.ListInteractionsRequest) (*executorv1.ListInteractionsResponse, error) {
	list, next, err := s.Store.ListInteractions(ctx, store.InteractionFilter{RunID: req.GetRunId(), Status: req.GetStatus(), Limit: int(req.GetPageSize()),
		Companies: store.ScopeCompanies(authz.Companies(ctx), req.GetCompanyId())}, req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &executorv1.ListInteractionsResponse{Interactions: list, NextPageToken: next}, nil
}

// GetInteraction returns one interaction.
func (s *Server) GetInteraction(ctx context.Context, req *executorv1.GetInteractionRequest) (*executorv1.GetInteractionResponse, error) {
	in, err := s.Store.GetInteraction(ctx, req.GetInteractionId())
	if err != nil {
		return nil, err
	}
	return &executorv1.GetInteractionResponse{Interaction: in}, nil
}

// AnswerInteraction answers an interaction and submits its continuation
// run once.
func (s *Server) AnswerInteraction(ctx context.Context, req *executorv1.AnswerInteractionRequest) (*executorv1.AnswerInteractionResponse, error) {
	answers := make([]runtimeq.Answer, 0, len(req.GetAnswers()))
	for _, a := range req.GetAnswers() {
		answers = append(answers, runtimeq.Answer{QuestionID: a.GetQuestionId(), OptionIDs: a.GetOptionIds(), Text: a.GetText()})
	}
	// The answer, and the continuation run it submits, record who
	// answered (SPEC T2).
	out, err := s.Store.AnswerInteraction(store.WithActor(ctx, s.principal(ctx)), req.GetInteractionId(), answers)
	if err != nil {
		return nil, err
	}
	resp := &executorv1.AnswerInteractionResponse{Interaction: out.Interaction, Created: out.Created}
	if out.ContinuationRunID == "" {
		return resp, nil
	}
	if out.Created {
		s.kick(out.ContinuationRunID)
	}
	run, err := s.Store.GetRun(ctx, out.ContinuationRunID)
	if err != nil {
		return nil, err
	}
	resp.ContinuationRun = visible(run)
	return resp, nil
}
