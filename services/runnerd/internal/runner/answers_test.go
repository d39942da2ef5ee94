package runner

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
)

// brokenConn is a live connection whose writes fail: its WebSocket was
// closed under it (a gateway connection that dropped).
func brokenConn(t *testing.T) *liveConn {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ws, err := websocket.Accept(w, req, nil)
		if err != nil {
			return
		}
		_ = ws.CloseNow()
	}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	require.NoError(t, err)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	require.NoError(t, ws.CloseNow())
	return &liveConn{id: 1, c: prp.NewConn(ws), cancel: func() {}, lastHeard: time.Now()}
}

// TestR4_AnswersWaitingForASnapshotSurviveAConnectionDroppedWhileSending:
// sending the first of several durable answers fails, which drops the
// connection and saves the state (whose settlement sends the waiting
// answers again, re-entrantly); the answers are all taken once, and
// nothing panics.
func TestR4_AnswersWaitingForASnapshotSurviveAConnectionDroppedWhileSending(t *testing.T) {
	t.Parallel()
	r := bareRunner(t)
	r.link.live = brokenConn(t)
	recs := []*runnerstate.CommandRecord{
		{CommandID: "cmd-1", ControllerSeq: 1, CommandType: CmdTurnSteer, Status: runnerstate.StatusCompleted},
		{CommandID: "cmd-2", ControllerSeq: 2, CommandType: CmdTurnSteer, Status: runnerstate.StatusCompleted},
		{CommandID: "cmd-3", ControllerSeq: 3, CommandType: CmdTurnSteer, Status: runnerstate.StatusCompleted},
	}
	gen, err := r.j.saveAsync()
	require.NoError(t, err)
	require.NotPanics(t, func() { r.j.answerWhenSaved(gen, recs) })
	assert.False(t, r.link.connected(), "the failed write dropped the connection")
	assert.Empty(t, r.j.answers, "every durable answer was taken")
	assert.Nil(t, r.exit, "a dropped connection is not fatal")
	st, err := r.j.store.Load()
	require.NoError(t, err)
	assert.Equal(t, runnerstate.LifecycleConnecting, st.Lifecycle, "the drop is persisted")
}
