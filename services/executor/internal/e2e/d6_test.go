package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthgrpc "google.golang.org/grpc/health/grpc_health_v1"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

// TestD6_RunOutcomesLatenciesAndPoolsAreOnTheExecutorsMetrics: after two
// runs succeed, a real executor's /metrics counts two succeeded outcomes
// (code none), observes each run's submit → turn.started and turn latency
// once, and shows both database pools (main, watch) with their bound and
// their acquisitions; the gateway's /metrics shows the two warm session
// scopes, their runners connected, none attached; every metric the
// Grafana dashboard in deploy/grafana queries is among those exported; and
// runnerd's log lines are on the gateway's log.
func TestD6_RunOutcomesLatenciesAndPoolsAreOnTheExecutorsMetrics(t *testing.T) {
	t.Parallel()
	port, err := stack.FreePort()
	require.NoError(t, err)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", port)
	gwPort, err := stack.FreePort()
	require.NoError(t, err)
	gwMetrics := fmt.Sprintf("127.0.0.1:%d", gwPort)
	h := newHarness(t, stack.Options{ExecutorArgs: []string{"-metrics-addr", metricsAddr}, MetricsPorts: map[string]int{"runnergw": gwPort}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, id := range []string{"d6-a", "d6-b"} {
		h.submit(id, "session-"+id, "measure this turn")
	}
	for _, id := range []string{"d6-a", "d6-b"} {
		require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.waitTerminal(ctx, id).GetState())
	}
	var m map[string]float64
	require.Eventually(t, func() bool {
		m = scrapeValues(t, metricsAddr)
		return m[`tether_executor_run_outcomes_total{code="none",outcome="succeeded"}`] == 2
	}, time.Minute, 50*time.Millisecond, "outcomes: %v", tetherMetrics(m))
	require.Equal(t, 2.0, m["tether_executor_submit_to_turn_started_seconds_count"], "%v", tetherMetrics(m))
	require.Positive(t, m["tether_executor_submit_to_turn_started_seconds_sum"])
	require.Equal(t, 2.0, m["tether_executor_turn_seconds_count"], "%v", tetherMetrics(m))
	for _, pool := range []string{"main", "watch"} {
		require.Positive(t, m[`tether_db_pool_max_connections{pool="`+pool+`"}`], "pool %s: %v", pool, tetherMetrics(m))
	}
	require.Positive(t, m[`tether_db_pool_acquires_total{pool="main"}`])
	// Both sessions stay warm on the gateway: two scopes, two runners
	// connected, no run attached.
	var gw map[string]float64
	require.Eventually(t, func() bool {
		gw = scrapeValues(t, gwMetrics)
		return gw[`tether_runnergw_session_scopes{state="known"}`] == 2 && gw[`tether_runnergw_session_scopes{state="connected"}`] == 2 &&
			gw[`tether_runnergw_session_scopes{state="attached"}`] == 0
	}, time.Minute, 50*time.Millisecond, "gateway: %v", tetherMetrics(gw))
	for k := range m {
		if strings.HasPrefix(k, "tether_executor_run_outcomes_total{") {
			require.Contains(t, k, `outcome="succeeded"`, "no other outcome happened")
		}
	}
	requireDashboardMetricsExported(t, m, gw)
	// runnerd's own log lines reach the gateway's log.
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(h.st.LogPath("runnergw"))
		return err == nil && strings.Contains(string(b), `"msg":"runnerd: runnerd starting"`) && strings.Contains(string(b), `"source":"runnerd"`)
	}, 30*time.Second, 100*time.Millisecond, "runnerd's lines are not on the gateway's log")
}

// requireDashboardMetricsExported fails when deploy/grafana's dashboard
// queries a metric that neither a scraped page holds nor a service's
// source declares (a renamed or removed metric leaves no panel silently
// empty).
func requireDashboardMetricsExported(t *testing.T, scraped ...map[string]float64) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "tether-dashboard.json"))
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	// A vector with no series yet (no retry happened) is not on a page:
	// the names the services' sources declare count too.
	exported := map[string]bool{}
	root := repoRoot
	declared := regexp.MustCompile(`"(tether_[a-z_]+)"`)
	for _, dir := range []string{"pkg", "services"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			for _, m := range declared.FindAllStringSubmatch(string(src), -1) {
				exported[m[1]] = true
			}
			return err
		}))
	}
	for _, m := range scraped {
		for k := range m {
			name, _, _ := strings.Cut(k, "{")
			exported[strings.TrimSuffix(strings.TrimSuffix(name, "_count"), "_sum")] = true
		}
	}
	metric := regexp.MustCompile(`\b(tether_[a-z_]+|grpc_server_[a-z_]+)`)
	require.NotEmpty(t, dash.Panels)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, "panel %q", p.Title)
		for _, tg := range p.Targets {
			for _, name := range metric.FindAllString(tg.Expr, -1) {
				name = strings.TrimSuffix(name, "_bucket")
				require.True(t, exported[name], "panel %q queries %s, which no service exported", p.Title, name)
			}
		}
	}
}

// TestD6_ARunsTraceHoldsItsDatabaseStatementsAndNoProbeOrHeartbeatIsTraced:
// with tracing on, the statements the executor runs while it drives a run
// (its event appends) are spans inside that run's trace, under its
// `executor drive` span, and so are the provider calls that started the
// provider for it (initialize, thread/start); meanwhile the gateway heartbeats every second
// and the executor is probed, and neither leaves a single span.
func TestD6_ARunsTraceHoldsItsDatabaseStatementsAndNoProbeOrHeartbeatIsTraced(t *testing.T) {
	t.Parallel()
	rec := newSpanRecorder(t)
	h := newHarnessWith(t, stack.Options{
		Env:          []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + rec.addr, "OTEL_BSP_SCHEDULE_DELAY=50"},
		ExecutorArgs: []string{"-gateway-ttl", "3s"}, // a heartbeat every second
	}, "backup-verifier", "executor")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h.st.SetExtraArgs("runnergw", h.st.RegistryArgs("executor")...)
	_, err := h.st.Start(ctx, "runnergw")
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ok := h.gateways(ctx)["runnergw"]; return ok }, time.Minute, 50*time.Millisecond)

	root := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x5c, 0x1e, 0x33, 0x07, 0x9a, 0x41, 0x4e, 0x0b, 0x8f, 0x12, 0x6d, 0xa2, 0x90, 0x03, 0x7e, 0x51},
		SpanID:     trace.SpanID{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88},
		TraceFlags: trace.FlagsSampled, Remote: true,
	})
	in := h.submitInput("d6-traced", "trace my statements")
	_, err = h.client.SubmitRun(trace.ContextWithSpanContext(ctx, root), &executorv1.SubmitRunRequest{RunId: "d6-traced", Input: in})
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_SUCCEEDED, h.waitTerminal(ctx, "d6-traced").GetState())
	conn, err := grpc.NewClient(h.st.Addr("executor"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	health := healthgrpc.NewHealthClient(conn)
	for range 5 {
		_, err := health.Check(ctx, &healthgrpc.HealthCheckRequest{})
		require.NoError(t, err)
	}
	time.Sleep(3 * time.Second) // three more heartbeats, exported within 50 ms each

	traceID := root.TraceID().String()
	var statements []string
	require.Eventually(t, func() bool {
		spans := rec.trace(traceID)
		statements = statements[:0]
		for _, s := range spans {
			if s.service != "executor" || !strings.HasPrefix(s.name, "INSERT") && !strings.HasPrefix(s.name, "batch") {
				continue
			}
			for p, ok := spans[s.parentID]; ok; p, ok = spans[p.parentID] {
				if p.name == "executor drive" {
					statements = append(statements, s.name)
					break
				}
			}
		}
		return len(statements) > 0
	}, time.Minute, 50*time.Millisecond, "no database span under the run's executor drive span: %+v", rec.trace(traceID))
	t.Logf("database spans under the run's drive: %v", statements)
	// The provider's start for the run — initialize, thread/start — is in
	// the run's trace too, not a trace of its own.
	require.Eventually(t, func() bool {
		names := map[string]bool{}
		for _, s := range rec.trace(traceID) {
			names[s.service+": "+s.name] = true
		}
		return names["runnerd: provider initialize"] && names["runnerd: provider thread/start"]
	}, time.Minute, 50*time.Millisecond, "the provider's start is not in the run's trace: %+v", rec.trace(traceID))

	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.spans {
		require.NotContains(t, s.name, "RegisterGateway", "a heartbeat was traced by %s", s.service)
		require.NotContains(t, s.name, "grpc.health.v1.Health", "a probe was traced by %s", s.service)
	}
}
