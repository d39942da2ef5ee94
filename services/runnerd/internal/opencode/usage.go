package opencode

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// usageFile (in the home, backed up with it) keeps, per OpenCode session,
// the usage of the assistant messages tether deleted from the history with
// a dropped turn (DropTurn): tokens the provider consumed that the history
// no longer shows, so the session's total never goes back.
const usageFile = "tether-usage.json"

type usageRecord struct {
	Dropped map[string]provider.Usage `json:"dropped"`
}

func (s *Session) readUsageFile() usageRecord {
	rec := usageRecord{Dropped: map[string]provider.Usage{}}
	if b, err := os.ReadFile(filepath.Join(s.home, usageFile)); err == nil {
		_ = json.Unmarshal(b, &rec)
	}
	if rec.Dropped == nil {
		rec.Dropped = map[string]provider.Usage{}
	}
	return rec
}

// droppedUsage is the dropped usage of session sid.
func (s *Session) droppedUsage(sid string) provider.Usage {
	return s.readUsageFile().Dropped[sid]
}

// addDropped records u as dropped from session sid (before the messages
// holding it are deleted).
func (s *Session) addDropped(sid string, u provider.Usage) error {
	if u == (provider.Usage{}) {
		return nil
	}
	rec := s.readUsageFile()
	d := rec.Dropped[sid]
	d.InputTokens += u.InputTokens
	d.CachedInputTokens += u.CachedInputTokens
	d.OutputTokens += u.OutputTokens
	rec.Dropped[sid] = d
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.home, usageFile, b, 0o600)
}

// DropTurn deletes the cut-off turn turnID (its user message and the
// assistant messages answering it) from the session's history (DELETE
// /session/{id}/message/{messageID}; file changes are not reverted), so
// that the retried prompt is in the history once (SPEC R12). The usage of
// the deleted messages is kept in usageFile first: the session total does
// not go back.
func (s *Session) DropTurn(ctx context.Context, turnID string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	s.mu.Lock()
	sid := s.sesID
	s.mu.Unlock()
	msgs, err := s.history(ctx, sid)
	if err != nil {
		return perr(failure.ProviderReconcileFailed, "OpenCode session history: %v", err)
	}
	var ids []string
	var dropped provider.Usage
	for _, m := range msgs {
		if m.Info.Role == "assistant" && m.Info.ParentID == turnID {
			ids = append(ids, m.Info.ID)
			if m.Info.Time.Completed != 0 {
				u, _ := usageOf(m.Info)
				dropped.InputTokens += u.InputTokens
				dropped.CachedInputTokens += u.CachedInputTokens
				dropped.OutputTokens += u.OutputTokens
			}
		}
	}
	found := false
	for _, m := range msgs {
		found = found || (m.Info.Role == "user" && m.Info.ID == turnID)
	}
	if !found {
		return nil
	}
	ids = append(ids, turnID) // the answers first: no answer outlives its prompt
	if err := s.addDropped(sid, dropped); err != nil {
		return perr(failure.ProviderError, "recording the usage of the dropped turn: %v", err)
	}
	for _, id := range ids {
		if err := s.call(ctx, http.MethodDelete, "/session/"+sid+"/message/"+id, nil, nil); err != nil && !isNotFound(err) {
			return perr(failure.ProviderError, "OpenCode delete message %s: %v", id, err)
		}
	}
	return nil
}
