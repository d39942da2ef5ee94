package store

import (
	"context"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// SessionRuns is what the store knows of one session scope.
type SessionRuns struct {
	Scope string
	Last  *executorv1.Run // the newest run
	// LastKey is the newest run's internal key (Last.RunId is the id its
	// company chose, SPEC T2).
	LastKey string
	Active  *executorv1.Run // the run holding a lease now, if any
	Open    bool            // some run of the scope has not ended
	Count   uint64
}

// Sessions groups a company's runs of a normalized session id by scope,
// newest scope activity first (bounded to the newest 1,000 runs).
func (s *Store) Sessions(ctx context.Context, companyID, sessionID string) ([]SessionRuns, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+runColumns+`, r.session_scope, r.run_id
FROM executor.runs r JOIN executor.coordinators c ON c.run_id = r.run_id
WHERE r.company_id = $1 AND r.normalized_session_id = $2
ORDER BY r.submit_seq DESC LIMIT 1000`, companyID, sessionID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SessionRuns
	idx := map[string]int{}
	for rows.Next() {
		var sc, key string
		run, _, err := scanRunWith(rows, &sc, &key)
		if err != nil {
			return nil, err
		}
		i, ok := idx[sc]
		if !ok {
			i = len(out)
			idx[sc] = i
			out = append(out, SessionRuns{Scope: sc, Last: run, LastKey: key})
		}
		sr := &out[i]
		sr.Count++
		switch run.GetState() {
		case executorv1.RunState_RUN_STATE_RUNNING:
			sr.Open = true
			if sr.Active == nil {
				sr.Active = run
			}
		case executorv1.RunState_RUN_STATE_QUEUED:
			sr.Open = true
		}
	}
	return out, rows.Err()
}
