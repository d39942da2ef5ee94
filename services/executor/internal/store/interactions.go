package store

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Interaction statuses and codes (SPEC E4, E5).
const (
	InteractionPending  = "pending"
	InteractionAnswered = "answered"
)

// recordInteractions opens the interactions a batch's fresh (never stored
// before) events filed under runID open (Decisions.Interactions), once
// per idempotency key.
func recordInteractions(ctx context.Context, tx execer, runID string, open []OpenInteraction) error {
	for _, in := range open {
		payload, err := json.Marshal(in.Payload)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `
INSERT INTO executor.interactions (interaction_id, idempotency_key, kind, source_run_id, company_id, title, summary,
       continuation_policy, provider_lost, runtime_request_id, payload)
SELECT $1, $2, $3, $4, r.company_id, $5, $6, $7, $8, $9, $10 FROM executor.runs r WHERE r.run_id = $4
ON CONFLICT (idempotency_key) DO NOTHING`,
			newID("ia-"), in.IdempotencyKey, in.Kind, runID, in.Title, in.Summary, in.ContinuationPolicy, in.ProviderLost,
			in.Payload.RuntimeRequestID, payload); err != nil {
			return err
		}
	}
	return nil
}

// governedWait makes a succeeded run's result a governed wait (SPEC E4)
// when the run waits on a durable pending interaction: the newest pending
// interaction the run opened (not one whose provider was lost: its
// fallback wakes the assignee instead), or one of its input's partial
// item-verdict responses.
func governedWait(ctx context.Context, tx pgx.Tx, rules Rules, runID string, res *executorv1.RunResult) error {
	if rules == nil {
		return errNoRules
	}
	var g governedRead
	if err := g.scan(tx.QueryRow(ctx, governedWaitSQL, runID)); err != nil {
		return err
	}
	return g.apply(ctx, tx, rules, runID, res)
}

// governedWaitSQL reads, in one round trip in the common case, the run's
// input with the newest pending interaction it opened (governedWait).
const governedWaitSQL = `
SELECT r.input, coalesce(i.interaction_id, ''), coalesce(i.title, ''), coalesce(i.summary, '')
  FROM executor.runs r LEFT JOIN LATERAL (
       SELECT interaction_id, title, summary FROM executor.interactions
        WHERE source_run_id = r.run_id AND status = 'pending' AND NOT provider_lost
        ORDER BY created_at DESC, interaction_id DESC LIMIT 1) i ON true
 WHERE r.run_id = $1`

// governedRead is governedWaitSQL's row: read by governedWait, or ahead
// of time in the first batch of a careful append that opens no
// interaction (nothing it writes before the run's finish changes it).
type governedRead struct {
	raw  []byte
	wait PendingInteraction
	ok   bool // read
}

func (g *governedRead) scan(row pgx.Row) error {
	if err := row.Scan(&g.raw, &g.wait.ID, &g.wait.Title, &g.wait.Summary); err != nil {
		return err
	}
	g.ok = true
	return nil
}

// apply makes res a governed wait when the read says the run waits: one
// more round trip only when the run's input continues pending
// interactions (partial item-verdict responses).
func (g *governedRead) apply(ctx context.Context, tx pgx.Tx, rules Rules, runID string, res *executorv1.RunResult) error {
	raw, wait := g.raw, g.wait
	in := &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, in); err != nil {
		return err
	}
	if continuing := rules.ContinuingInteractions(in); len(continuing) > 0 {
		err := tx.QueryRow(ctx, `
SELECT interaction_id, title, summary FROM executor.interactions
 WHERE status = 'pending' AND ((source_run_id = $1 AND NOT provider_lost) OR interaction_id = ANY($2))
 ORDER BY created_at DESC, interaction_id DESC LIMIT 1`, runID, continuing).Scan(&wait.ID, &wait.Title, &wait.Summary)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	if wait.ID == "" {
		return nil
	}
	return rules.GovernedWait(in, wait, res)
}

const interactionColumns = `interaction_id, idempotency_key, kind, status, source_run_id, company_id, title, summary,
       continuation_policy, runtime_request_id, payload, answers, coalesce(answer_digest, ''), coalesce(continuation_run_id, ''),
       created_at, answered_at, coalesce(answered_by, ''),
       coalesce((SELECT x.client_run_id FROM executor.runs x WHERE x.run_id = source_run_id), source_run_id)`

// interactionRow is a stored interaction.
type interactionRow struct {
	pb *executorv1.Interaction
	// sourceKey is the source run's internal key (pb.SourceRunId is the
	// id its company chose, SPEC T2).
	sourceKey string
	questions []Question
	answers   []Answer
	digest    string
}

func scanInteraction(row pgx.Row) (*interactionRow, error) {
	var (
		r                  = &interactionRow{pb: &executorv1.Interaction{}}
		payload, answers   []byte
		created            time.Time
		answered           *time.Time
		policy, runtimeReq string
	)
	p := r.pb
	if err := row.Scan(&p.InteractionId, &p.IdempotencyKey, &p.Kind, &p.Status, &r.sourceKey, &p.CompanyId, &p.Title, &p.Summary,
		&policy, &runtimeReq, &payload, &answers, &r.digest, &p.ContinuationRunId, &created, &answered, &p.AnsweredBy, &p.SourceRunId); err != nil {
		return nil, err
	}
	p.ContinuationPolicy, p.RuntimeRequestId = policy, runtimeReq
	if r.sourceKey != p.SourceRunId {
		// The key names the run by its internal key (SPEC T2).
		p.IdempotencyKey = strings.ReplaceAll(p.IdempotencyKey, ":"+r.sourceKey+":", ":"+p.SourceRunId+":")
	}
	var qp QuestionsPayload
	if err := json.Unmarshal(payload, &qp); err != nil {
		return nil, err
	}
	r.questions = qp.Questions
	if len(answers) > 0 {
		if err := json.Unmarshal(answers, &r.answers); err != nil {
			return nil, err
		}
	}
	for _, q := range qp.Questions {
		pq := &executorv1.InteractionQuestion{Id: q.ID, Prompt: q.Prompt, Required: q.Required, SelectionMode: q.SelectionMode}
		for _, o := range q.Options {
			pq.Options = append(pq.Options, &executorv1.InteractionOption{Id: o.ID, Label: o.Label, Description: o.Description, FreeText: o.FreeText})
		}
		p.Questions = append(p.Questions, pq)
	}
	for _, a := range r.answers {
		p.Answers = append(p.Answers, &executorv1.InteractionAnswer{QuestionId: a.QuestionID, OptionIds: a.OptionIDs, Text: a.Text})
	}
	p.CreatedAt = timestamppb.New(created)
	if answered != nil {
		p.AnsweredAt = timestamppb.New(*answered)
	}
	return r, nil
}

func errInteractionNotFound(id string) error {
	return failure.New(codes.NotFound, failure.InteractionNotFound, "interaction %q does not exist", id)
}

// GetInteraction returns one interaction.
func (s *Store) GetInteraction(ctx context.Context, id string) (*executorv1.Interaction, error) {
	r, err := scanInteraction(s.pool.QueryRow(ctx, `SELECT `+interactionColumns+` FROM executor.interactions WHERE interaction_id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errInteractionNotFound(id)
	}
	if err != nil {
		return nil, err
	}
	return r.pb, nil
}

// InteractionFilter narrows ListInteractions.
type InteractionFilter struct {
	// RunID keeps the interactions of the runs of this id (the id their
	// companies chose, SPEC T2) among Companies.
	RunID, Status string
	Limit         int
	// Companies, when not nil, keeps only these companies' interactions
	// (SPEC T2).
	Companies []string
}

// ListInteractions lists interactions, newest first, a page at a time: the
// token (bound to the filter) of the next page is "" on the last one.
func (s *Store) ListInteractions(ctx context.Context, f InteractionFilter, pageToken string) ([]*executorv1.Interaction, string, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	filter := filterDigest("interactions", f.Companies, f.RunID, f.Status)
	cur, ok, err := decodePageToken(pageToken, filter)
	if err != nil {
		return nil, "", err
	}
	var after any // (created_at, interaction_id) of the previous page's last row
	if ok {
		after = time.UnixMicro(cur.At)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+interactionColumns+` FROM executor.interactions
 WHERE ($1 = '' OR source_run_id IN (SELECT r.run_id FROM executor.runs r WHERE r.client_run_id = $1
                                       AND ($4::text[] IS NULL OR r.company_id = ANY($4))))
   AND ($2 = '' OR status = $2)
   AND ($4::text[] IS NULL OR company_id = ANY($4))
   AND ($5::timestamptz IS NULL OR (created_at, interaction_id) < ($5, $6))
 ORDER BY created_at DESC, interaction_id DESC LIMIT $3`, f.RunID, f.Status, f.Limit+1, companiesArg(f.Companies), after, cur.ID)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []*executorv1.Interaction
	for rows.Next() {
		r, err := scanInteraction(rows)
		if err != nil {
			return nil, "", err
		}
		out = append(out, r.pb)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > f.Limit {
		out = out[:f.Limit]
		last := out[f.Limit-1]
		next = encodePageToken(filter, pageCursor{At: last.GetCreatedAt().AsTime().UnixMicro(), ID: last.GetInteractionId()})
	}
	return out, next, nil
}

// AnswerOutcome is what AnswerInteraction did.
type AnswerOutcome struct {
	Interaction *executorv1.Interaction
	// ContinuationRunID is the run the (complete) answer submitted.
	ContinuationRunID string
	// Created is false when this exact answer was recorded before.
	Created bool
}

// ContinuationRunID names the run an interaction's answer submits.
func ContinuationRunID(interactionID string) string { return "wake-" + interactionID }

// AnswerInteraction records an answer and submits the continuation run, in
// one transaction, exactly once (SPEC E4): the continuation continues the
// source run's session with the answer in its input (interaction
// responses, and the answer in words as its prompt). The same answer again
// returns the same run; another answer after the first is
// interaction_already_answered; an answer that does not fit the questions
// is interaction_answer_invalid; nothing is written for either. A partial
// item-verdict answer is recorded and the interaction stays pending.
func (s *Store) AnswerInteraction(ctx context.Context, id string, answers []Answer) (AnswerOutcome, error) {
	var out AnswerOutcome
	rules, err := s.decider()
	if err != nil {
		return out, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = AnswerOutcome{}
		r, err := scanInteraction(tx.QueryRow(ctx, `SELECT `+interactionColumns+` FROM executor.interactions WHERE interaction_id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return errInteractionNotFound(id)
		}
		if err != nil {
			return err
		}
		p := r.pb
		if p.GetStatus() == InteractionAnswered {
			merged, _, err := rules.MergeAnswers(p.GetKind(), r.questions, nil, answers)
			if err == nil && answerDigest(merged) == r.digest {
				out.Interaction, out.ContinuationRunID = p, p.GetContinuationRunId()
				return nil
			}
			return failure.New(codes.FailedPrecondition, failure.InteractionAlreadyAnswered,
				"interaction %q was already answered otherwise (continuation run %q)", id, p.GetContinuationRunId())
		}
		merged, complete, err := rules.MergeAnswers(p.GetKind(), r.questions, r.answers, answers)
		var ae *AnswerError
		if errors.As(err, &ae) {
			return failure.New(codes.InvalidArgument, failure.InteractionAnswerInvalid, "%s", ae.Reason)
		}
		if err != nil {
			return err
		}
		digest := answerDigest(merged)
		if digest == r.digest {
			out.Interaction = p // the same partial answer again
			return nil
		}
		raw, err := json.Marshal(merged)
		if err != nil {
			return err
		}
		status, runID := InteractionPending, ""
		if complete {
			status, runID = InteractionAnswered, ContinuationRunID(id)
			in, err := continuationInput(ctx, tx, rules, r, merged)
			if err != nil {
				return err
			}
			created, _, err := submit(ctx, tx, runID, in)
			if err != nil {
				return err
			}
			if created {
				if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, RunsChannel, runID); err != nil {
					return err
				}
			}
		}
		if _, err := tx.Exec(ctx, `
UPDATE executor.interactions SET answers = $2, answer_digest = $3, status = $4, continuation_run_id = nullif($5, ''),
       answered_at = CASE WHEN $4 = 'answered' THEN now() END,
       answered_by = CASE WHEN $4 = 'answered' THEN nullif($6, '') END
 WHERE interaction_id = $1`, id, raw, digest, status, runID, ActorOf(ctx)); err != nil {
			return err
		}
		r2, err := scanInteraction(tx.QueryRow(ctx, `SELECT `+interactionColumns+` FROM executor.interactions WHERE interaction_id = $1`, id))
		if err != nil {
			return err
		}
		out = AnswerOutcome{Interaction: r2.pb, ContinuationRunID: runID, Created: true}
		return nil
	})
	return out, err
}

// continuationInput is the source run's input continued with the answer:
// the same session (its warm provider, when live), the answer in words as
// the prompt, and the interaction's response.
func continuationInput(ctx context.Context, tx pgx.Tx, rules Rules, r *interactionRow, answers []Answer) (*prpv1.ExecutionInput, error) {
	var raw []byte
	if err := tx.QueryRow(ctx, `SELECT input FROM executor.runs WHERE run_id = $1`, r.sourceKey).Scan(&raw); err != nil {
		return nil, fmt.Errorf("reading the source run of interaction %s: %w", r.pb.GetInteractionId(), err)
	}
	in := &prpv1.ExecutionInput{}
	if err := proto.Unmarshal(raw, in); err != nil {
		return nil, err
	}
	in.Task = &prpv1.Task{Prompt: rules.AnswerPrompt(r.pb.GetTitle(), r.questions, answers)}
	resp := &prpv1.InteractionResponse{InteractionId: r.pb.GetInteractionId(), Kind: r.pb.GetKind(), Status: InteractionAnswered, Complete: true}
	for _, a := range answers {
		resp.Answers = append(resp.Answers, &prpv1.InteractionResponseAnswer{QuestionId: a.QuestionID, OptionIds: a.OptionIDs, Text: a.Text})
	}
	in.InteractionResponses = []*prpv1.InteractionResponse{resp}
	return in, nil
}

func answerDigest(answers []Answer) string {
	if len(answers) == 0 {
		return ""
	}
	b, _ := json.Marshal(answers)
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
