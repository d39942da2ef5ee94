package grpcx

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// accessLines are the JSON log lines of logs whose msg is msg.
func accessLines(t *testing.T, logs string, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// TestP1_ASuccessfulUnaryCallIsCountedNotLoggedOnALineOfItsOwn: with the
// default access log (summary), 20 successful GetRun calls write no
// "finished call" line at info (the line was ≈ 10 % of the executor's CPU
// per call) and one "grpc calls" line counts them; a failed call still gets
// its line, at its code's level; health checks are neither logged nor
// counted. -access-log all logs every call as before.
func TestP1_ASuccessfulUnaryCallIsCountedNotLoggedOnALineOfItsOwn(t *testing.T) {
	const n = 20
	run := func(mode string) string {
		logs := &syncBuffer{}
		h := startServer(t, func(c *Config) { c.Logger = NewLogger("info", "json", logs); c.AccessLog = mode })
		c := executorv1.NewExecutorServiceClient(h.conn)
		for range n {
			if _, err := c.GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "run-1"}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := healthpb.NewHealthClient(h.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		_, err := backupv1.NewBackupVerifierClient(h.conn).VerifyStamp(ctxT(t), &backupv1.VerifyStampRequest{LeaseId: "x"})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("invalid VerifyStamp: %v", err)
		}
		h.stop(t)
		return h.logs.String() + logs.String()
	}

	out := run("")
	finished := accessLines(t, out, "finished call")
	if len(finished) != 1 || finished[0]["grpc.method"] != "VerifyStamp" || finished[0]["grpc.code"] != "InvalidArgument" || finished[0]["grpc.time_ms"] == nil {
		t.Errorf("summary mode: %d finished-call lines, want only the failed call's:\n%s", len(finished), out)
	}
	sums := accessLines(t, out, "grpc calls")
	if len(sums) != 1 {
		t.Fatalf("summary mode: %d grpc calls lines, want 1:\n%s", len(sums), out)
	}
	methods, _ := sums[0]["methods"].(map[string]any)
	getRun, _ := methods["/tether.executor.v1.ExecutorService/GetRun"].(map[string]any)
	if sums[0]["calls"] != float64(n) || len(methods) != 1 || getRun["calls"] != float64(n) {
		t.Errorf("summary line %v: want %d GetRun calls and nothing else", sums[0], n)
	}

	out = run(AccessLogAll)
	if got := len(accessLines(t, out, "finished call")); got != n+1 {
		t.Errorf("-access-log all: %d finished-call lines at info, want %d:\n%s", got, n+1, out)
	}
	if got := len(accessLines(t, out, "grpc calls")); got != 0 {
		t.Errorf("-access-log all: %d summary lines", got)
	}
}

// TestP1_ASlowUnaryCallIsLoggedOnALineOfItsOwnWithItsOwnDuration: a call
// at or past -access-log-slow gets its line, with the handler's duration
// (not the replay's) and the run_id.
func TestP1_ASlowUnaryCallIsLoggedOnALineOfItsOwnWithItsOwnDuration(t *testing.T) {
	logs := &syncBuffer{}
	h := startServer(t, func(c *Config) { c.Logger = NewLogger("info", "json", logs); c.AccessLogSlow = time.Nanosecond })
	c := executorv1.NewExecutorServiceClient(h.conn)
	for range 3 {
		if _, err := c.GetRun(ctxT(t), &executorv1.GetRunRequest{RunId: "run-slow"}); err != nil {
			t.Fatal(err)
		}
	}
	h.stop(t)
	finished := accessLines(t, logs.String(), "finished call")
	if len(finished) != 3 {
		t.Fatalf("%d finished-call lines, want 3:\n%s", len(finished), logs.String())
	}
	for _, l := range finished {
		if l["run_id"] != "run-slow" || l["grpc.code"] != "OK" || l["level"] != "INFO" || l["grpc.time_ms"] == "0" || l["grpc.start_time"] == nil {
			t.Errorf("line %v", l)
		}
	}
	if got := len(accessLines(t, logs.String(), "grpc calls")); got != 0 {
		t.Errorf("%d summary lines for calls that were all logged", got)
	}
}

func TestNewRejectsAnUnknownAccessLogMode(t *testing.T) {
	if _, err := New(Config{GRPCAddr: "127.0.0.1:0", AccessLog: "some"}); err == nil {
		t.Fatal("New accepted -access-log some")
	}
}
