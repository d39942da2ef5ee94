package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/safefs"
)

// Runner logs on the gateway's stream (SPEC D6). runnerd writes its log to
// runnerd.log in its scope root (the gateway opens it and hands runnerd the
// descriptor, so runnerd outlives a gateway restart without losing it);
// the gateway follows every known scope's log and re-emits each line on
// its own log, as one record with source=runnerd, the scope and the
// line's own level, message and attributes. The file is bounded: past
// Config.RunnerLogMaxBytes (maxRunnerLogBytes) it is copied to runnerd.log.1 (the one older
// generation kept) and truncated (runnerd appends, so it goes on writing
// at the new end; a line written between the copy and the truncation is
// lost, as with logrotate's copytruncate).
const (
	maxRunnerLogBytes    = 8 << 20
	runnerLogPoll        = 500 * time.Millisecond
	runnerLogChunk       = 256 << 10 // one read
	runnerLogChunks      = 16        // reads per scope and poll at most (4 MiB)
	runnerLogOld         = runnerdLog + ".1"
	maxRunnerLogLineSize = grpcx.MaxLogValueBytes
)

// logFollower is one scope's runnerd.log as far as it was re-emitted.
type logFollower struct {
	scope string
	f     *os.File // read-only, opened without following a link
	off   int64
	part  []byte // an unterminated last line, kept for the next read
}

// followRunnerLogs re-emits the runnerd logs of the scopes this gateway
// holds a runner for until ctx ends. A scope first seen at startup (a
// runner re-learned after a gateway restart) is followed from the end of
// its log; one launched by this process from where its launch began.
func (g *Gateway) followRunnerLogs(ctx context.Context) {
	followers := map[string]*logFollower{}
	defer func() {
		for _, f := range followers {
			f.f.Close()
		}
	}()
	t := time.NewTicker(runnerLogPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.mu.Lock()
		scopes := make(map[string]bool, len(g.runners))
		for sc := range g.runners {
			scopes[sc] = true
		}
		starts := g.logStarts
		g.logStarts = nil
		g.mu.Unlock()
		for sc, f := range followers {
			if !scopes[sc] {
				f.f.Close()
				delete(followers, sc)
			}
		}
		for sc := range scopes {
			f := followers[sc]
			if start, ok := starts[sc]; ok && f != nil && start < f.off {
				f.off, f.part = start, nil // relaunched after a rotation
			}
			if f == nil {
				start, launched := starts[sc]
				if f = g.openRunnerLog(sc, start, launched); f == nil {
					continue
				}
				followers[sc] = f
			}
			g.pumpRunnerLog(f)
		}
	}
}

// noteLaunch records where scope's runnerd.log ended when this process
// launched its runnerd: its lines are followed from there.
func (g *Gateway) noteLaunch(scope string, logf *os.File) {
	st, err := logf.Stat()
	if err != nil {
		return
	}
	g.mu.Lock()
	if g.logStarts == nil {
		g.logStarts = map[string]int64{}
	}
	g.logStarts[scope] = st.Size()
	g.mu.Unlock()
}

func (g *Gateway) openRunnerLog(scope string, start int64, launched bool) *logFollower {
	d, err := openScopeDir(g.stateDir(scope), "", false)
	if err != nil {
		return nil
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), runnerdLog, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), filepath.Join(g.stateDir(scope), runnerdLog))
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil
	} else if !launched {
		start = st.Size()
	}
	return &logFollower{scope: scope, f: f, off: start}
}

// pumpRunnerLog re-emits what f's log gained since the last poll and
// rotates the log when it outgrew its bound.
func (g *Gateway) pumpRunnerLog(f *logFollower) {
	st, err := f.f.Stat()
	if err != nil {
		return
	}
	if st.Size() < f.off {
		f.off, f.part = 0, nil // truncated (rotated): from its start
	}
	for chunks := 0; st.Size() > f.off && chunks < runnerLogChunks; chunks++ {
		buf := make([]byte, min(st.Size()-f.off, runnerLogChunk))
		n, err := f.f.ReadAt(buf, f.off)
		if err != nil && !errors.Is(err, io.EOF) || n == 0 {
			return
		}
		f.off += int64(n)
		data := append(f.part, buf[:n]...)
		f.part = nil
		for len(data) > 0 {
			i := bytes.IndexByte(data, '\n')
			if i < 0 {
				if len(data) > maxRunnerLogLineSize {
					g.emitRunnerLine(f.scope, data) // an endless line is cut
				} else {
					f.part = append([]byte(nil), data...)
				}
				break
			}
			g.emitRunnerLine(f.scope, data[:i])
			data = data[i+1:]
		}
	}
	if st.Size() > g.cfg.RunnerLogMaxBytes && f.off >= st.Size() {
		g.rotateRunnerLog(f)
	}
}

// rotateRunnerLog copies scope's runnerd.log to runnerd.log.1 and
// truncates it, following no link.
func (g *Gateway) rotateRunnerLog(f *logFollower) {
	d, err := openScopeDir(g.stateDir(f.scope), "", false)
	if err != nil {
		return
	}
	defer d.Close()
	data, err := safefs.ReadFile(d, runnerdLog, 2*g.cfg.RunnerLogMaxBytes+runnerLogChunk)
	if err != nil {
		return
	}
	if err := safefs.WriteFile(d, runnerLogOld, data, 0o600); err != nil {
		g.log.Warn("rotating runnerd.log", "session_scope", shortScope(f.scope), "err", err)
		return
	}
	w, err := safefs.OpenAppend(d, runnerdLog, 0o600)
	if err != nil {
		return
	}
	defer w.Close()
	if err := w.Truncate(0); err == nil {
		f.off, f.part = 0, nil
	}
}

// emitRunnerLine logs one line of runnerd's log on the gateway's log.
func (g *Gateway) emitRunnerLine(scope string, line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	args := []any{"source", "runnerd", "session_scope", shortScope(scope)}
	var rec map[string]any
	if len(line) <= maxRunnerLogLineSize && json.Unmarshal(line, &rec) == nil {
		level := slog.LevelInfo
		if s, ok := rec["level"].(string); ok {
			_ = level.UnmarshalText([]byte(s))
		}
		msg, _ := rec["msg"].(string)
		var attrs []any
		for k, v := range rec {
			if k != "time" && k != "level" && k != "msg" {
				attrs = append(attrs, k, v)
			}
		}
		g.log.Log(context.Background(), level, "runnerd: "+msg, append(args, slog.Group("runnerd", attrs...))...)
		return
	}
	// Not runnerd's JSON (a panic, the Go runtime's output): as it is.
	g.log.Warn("runnerd output", append(args, "line", grpcx.CapLogValue(string(line), maxRunnerLogLineSize))...)
}

// shortScope is a scope digest's first 16 hex digits, for log lines.
func shortScope(scope string) string {
	if len(scope) > 16 {
		return scope[:16]
	}
	return scope
}
