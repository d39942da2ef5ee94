package grpcx

// The access log of unary calls (SPEC P1). A line per call (go-grpc-middleware's
// "finished call", JSON-encoded and written to stderr) was ≈ 10 % of the
// executor's CPU per GetRun or SubmitRun at 32 callers. By default
// (AccessLog "summary") a unary call that succeeded within AccessLogSlow is
// counted instead, and one "grpc calls" line per AccessLogInterval gives the
// counts per method; a call that failed, or took AccessLogSlow or longer, is
// logged on its own line as before, at its code's level. AccessLog "all" logs
// every call (the previous behaviour); with the logger at debug, the calls
// the summary counts are logged too, at debug. Streams are logged per call
// in both modes (they are few and long).

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
)

// Access log modes (Config.AccessLog, -access-log).
const (
	AccessLogSummary = "summary"
	AccessLogAll     = "all"
)

// Access log defaults.
const (
	DefaultAccessLogSlow     = time.Second
	DefaultAccessLogInterval = time.Minute
)

func checkAccessLog(mode string) error {
	switch mode {
	case "", AccessLogSummary, AccessLogAll:
		return nil
	}
	return fmt.Errorf("grpcx: unknown access log mode %q (want summary|all)", mode)
}

// accessLog is the unary access log interceptor.
type accessLog struct {
	log      *slog.Logger
	full     grpc.UnaryServerInterceptor // the per-call line
	all      bool
	slow     time.Duration
	interval time.Duration

	methods sync.Map // full method → *methodCounts
	stop    chan struct{}
	done    chan struct{}
	started atomic.Bool
	once    sync.Once
}

type methodCounts struct {
	calls atomic.Int64
	maxNs atomic.Int64
}

// replayKey marks a call whose line is written after its handler ran (the
// summary mode's failed or slow calls): the line carries the call's own
// start and duration, not the replay's.
type replayKey struct{}

type replayed struct {
	start time.Time
	d     time.Duration
	debug bool // a call the summary counted, logged because the logger is at debug
}

// replayFields are the fields of a replayed call's line that override what
// the middleware measured around the replay.
func replayFields(ctx context.Context) logging.Fields {
	r, ok := ctx.Value(replayKey{}).(*replayed)
	if !ok {
		return nil
	}
	return logging.Fields{"grpc.start_time", r.start.Format(time.RFC3339), "grpc.time_ms", strconv.FormatFloat(float64(r.d)/float64(time.Millisecond), 'f', 3, 64)}
}

// demoted says the line of the call in ctx goes at debug.
func demoted(ctx context.Context) bool {
	r, ok := ctx.Value(replayKey{}).(*replayed)
	return ok && r.debug
}

func (a *accessLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if a.all || infraMethod(info.FullMethod) {
		return a.full(ctx, req, info, handler)
	}
	start := time.Now()
	resp, err := handler(ctx, req)
	d := time.Since(start)
	if err != nil || d >= a.slow {
		return a.full(context.WithValue(ctx, replayKey{}, &replayed{start: start, d: d}), req, info, func(context.Context, any) (any, error) { return resp, err })
	}
	a.count(info.FullMethod, d)
	if a.log.Enabled(ctx, slog.LevelDebug) {
		return a.full(context.WithValue(ctx, replayKey{}, &replayed{start: start, d: d, debug: true}), req, info, func(context.Context, any) (any, error) { return resp, err })
	}
	return resp, err
}

func (a *accessLog) count(method string, d time.Duration) {
	v, ok := a.methods.Load(method)
	if !ok {
		v, _ = a.methods.LoadOrStore(method, &methodCounts{})
	}
	c := v.(*methodCounts)
	c.calls.Add(1)
	for ns := int64(d); ; {
		m := c.maxNs.Load()
		if ns <= m || c.maxNs.CompareAndSwap(m, ns) {
			break
		}
	}
}

// flush logs the calls counted since the last flush, if any: one info line
// "grpc calls" with the total and, per method, the calls and the slowest
// one's milliseconds.
func (a *accessLog) flush() {
	type entry struct {
		method string
		calls  int64
		maxNs  int64
	}
	var (
		entries []entry
		total   int64
	)
	a.methods.Range(func(k, v any) bool {
		c := v.(*methodCounts)
		n := c.calls.Swap(0)
		m := c.maxNs.Swap(0)
		if n > 0 {
			entries = append(entries, entry{k.(string), n, m})
			total += n
		}
		return true
	})
	if total == 0 {
		return
	}
	slices.SortFunc(entries, func(x, y entry) int { return int(y.calls - x.calls) })
	methods := make([]any, 0, len(entries))
	for _, e := range entries {
		methods = append(methods, slog.Group(e.method, "calls", e.calls, "max_ms", float64(e.maxNs/1000)/1000))
	}
	a.log.Info("grpc calls", "calls", total, "interval", a.interval.String(), slog.Group("methods", methods...))
}

// run flushes every interval until close.
func (a *accessLog) run() {
	defer close(a.done)
	t := time.NewTicker(a.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			a.flush()
		case <-a.stop:
			a.flush()
			return
		}
	}
}

func (a *accessLog) start() {
	if a.all || a.started.Swap(true) {
		return
	}
	go a.run()
}

// close flushes what is counted and stops the ticker (after the server
// stopped, so that every call is in a line).
func (a *accessLog) close() {
	if !a.started.Load() {
		return
	}
	a.once.Do(func() { close(a.stop) })
	<-a.done
}
