package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/api"
	"github.com/tether-run/tether/services/executor/internal/runrules"
	"github.com/tether-run/tether/services/executor/internal/secrets"
	"github.com/tether-run/tether/services/executor/internal/store"
	"github.com/tether-run/tether/services/executor/internal/watch"
)

func TestMain(m *testing.M) { pgtest.MainCheckingLeaks(m) }

// gatewayInternal are the public services' methods that are not for
// people: a gateway's own registration.
var gatewayInternal = map[string]bool{executorv1.GatewayRegistry_RegisterGateway_FullMethodName: true}

// SPEC U1: every method of ExecutorService and GatewayRegistry (but the
// gateways' RegisterGateway) is called by a tetherctl command, read from
// the service descriptors so that a new RPC without a command fails here;
// and every command of the table is dispatched (its -h answers).
func TestU1_EveryPublicMethodHasACommand(t *testing.T) {
	covered := map[string][]string{}
	for _, c := range commands {
		for _, m := range c.methods {
			covered[m] = append(covered[m], c.name)
		}
	}
	n := 0
	for _, sd := range []protoreflect.ServiceDescriptor{
		executorv1.File_tether_executor_v1_executor_proto.Services().ByName("ExecutorService"),
		executorv1.File_tether_executor_v1_fleet_proto.Services().ByName("GatewayRegistry"),
		executorv1.File_tether_executor_v1_companies_proto.Services().ByName("Companies"),
	} {
		require.NotNil(t, sd)
		for i := range sd.Methods().Len() {
			full := "/" + string(sd.FullName()) + "/" + string(sd.Methods().Get(i).Name())
			n++
			if gatewayInternal[full] {
				continue
			}
			if len(covered[full]) == 0 {
				t.Errorf("no tetherctl command calls %s", full)
			}
		}
	}
	require.GreaterOrEqual(t, n, 21)
	for _, c := range commands {
		cmd, _ := findCommand(strings.Fields(c.name))
		require.NotNil(t, cmd, c.name)
		require.Equal(t, c.name, cmd.name)
		t.Setenv("XDG_CONFIG_HOME", t.TempDir())
		err := runIO(append(strings.Fields(c.name), "-h"), strings.NewReader(""), io.Discard)
		require.Equal(t, 0, exitCode(err, io.Discard), "%s -h: %v", c.name, err)
	}
}

// clearEnv unsets tetherctl's environment for the test and points the
// profiles file at dir.
func clearEnv(t *testing.T, dir string) {
	for _, v := range []string{"TETHER_PROFILE", "TETHER_CONFIG", "TETHER_EXECUTOR_ADDR", "TETHER_EXECUTOR_CA",
		"TETHER_CLIENT_CERT", "TETHER_CLIENT_KEY", "TETHER_TOKEN", "TETHER_COMPANY"} {
		t.Setenv(v, "")
	}
	t.Setenv("XDG_CONFIG_HOME", dir)
}

// SPEC U1: no silent company default; profiles (address, credentials,
// company) come from the profiles file, chosen by -profile or
// TETHER_PROFILE, and a flag or its environment variable overrides them.
func TestU1_ProfilesAndNoSilentCompany(t *testing.T) {
	dir := t.TempDir()
	clearEnv(t, dir)
	// Without a company, the commands that need one refuse before any call.
	for _, args := range [][]string{
		{"submit", "-session", "s", "-prompt", "p"},
		{"sessions", "get", "-session", "s"},
		{"sessions", "replace", "-session", "s", "-reason", "r", "-by", "me"},
		{"secrets", "list"},
	} {
		err := runIO(append([]string{"-addr", "127.0.0.1:1"}, args...), strings.NewReader(""), io.Discard)
		require.ErrorIs(t, err, errNoCompany, "%v", args)
	}

	require.NoError(t, os.MkdirAll(filepath.Join(dir, "tether"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tether", "acme.token"), []byte("tok-acme\n"), 0o600))
	cfg := `{"default_profile": "dev", "profiles": {
	  "dev":  {"address": "127.0.0.1:7400", "company": "acme", "token_file": "acme.token"},
	  "prod": {"address": "exec.example:7400", "ca": "ca.pem", "company": "globex", "token": "tok-globex"}}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tether", "config.json"), []byte(cfg), 0o600))

	resolve := func(args ...string) globals {
		t.Helper()
		var g globals
		fs := newFlagSet("tetherctl")
		g.register(fs)
		require.NoError(t, fs.Parse(args))
		_, _, _, err := g.resolve(fs)
		require.NoError(t, err)
		return g
	}
	g := resolve()
	require.Equal(t, "127.0.0.1:7400", g.addr)
	require.Equal(t, "acme", g.company)
	require.Equal(t, "tok-acme", g.token, "token_file, relative to the profiles file")

	g = resolve("-profile", "prod")
	require.Equal(t, "exec.example:7400", g.addr)
	require.Equal(t, filepath.Join(dir, "tether", "ca.pem"), g.ca)
	require.Equal(t, "globex", g.company)
	require.Equal(t, "tok-globex", g.token)

	t.Setenv("TETHER_PROFILE", "prod")
	t.Setenv("TETHER_COMPANY", "initech")
	g = resolve("-addr", "10.0.0.9:7400")
	require.Equal(t, "10.0.0.9:7400", g.addr, "a flag overrides the profile")
	require.Equal(t, "initech", g.company, "an environment variable overrides the profile")
	require.Equal(t, "tok-globex", g.token)

	var g2 globals
	fs := newFlagSet("tetherctl")
	g2.register(fs)
	require.NoError(t, fs.Parse([]string{"-profile", "staging"}))
	_, _, _, err := g2.resolve(fs)
	require.ErrorContains(t, err, `profile "staging" is not in`)

	var out bytes.Buffer
	require.NoError(t, runIO([]string{"profiles"}, strings.NewReader(""), &out))
	require.Contains(t, out.String(), "prod")
	require.Regexp(t, `\*\s+prod\s+exec.example:7400\s+globex`, out.String(), "TETHER_PROFILE selects prod")
}

// executor starts a real executor API (ExecutorService and
// GatewayRegistry, real gRPC on loopback, a real PostgreSQL) without a
// dispatcher: runs stay queued.
func executor(t *testing.T) (string, *store.Store) {
	t.Helper()
	dsn := pgtest.NewDB(t, pgtest.GooseMigrator(store.Migrations, "migrations", goose.WithTableName("executor_goose_version")))
	ctx, cancel := context.WithCancel(context.Background())
	st, err := store.Open(ctx, dsn, runrules.New())
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := watch.NewHub(st, watch.WithEncoder(api.EncodeWatchEvent))
	srv, err := grpcx.New(grpcx.Config{Name: "executor", GRPCAddr: "127.0.0.1:0", Logger: log}, api.WatchCodec())
	require.NoError(t, err)
	keys, err := secrets.New(make([]byte, 32))
	require.NoError(t, err)
	executorv1.RegisterExecutorServiceServer(srv.GRPC(), &api.Server{Store: st, Hub: hub, Vault: &secrets.Vault{Keys: keys, Store: st}})
	executorv1.RegisterGatewayRegistryServer(srv.GRPC(), &api.Registry{Store: st})
	require.NoError(t, srv.Listen())
	served, listened := make(chan struct{}), make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ctx) }()
	go func() { defer close(listened); hub.Listen(ctx, st.Pool(), watch.Handlers{}, log) }()
	t.Cleanup(func() {
		cancel()
		<-served
		<-listened
		st.Close()
	})
	return srv.Addr().String(), st
}

// SPEC U1: tetherctl against a real executor: submit with -provider, -env,
// -secret-ref and -input-file, list with a company filter and paging
// (-all follows the tokens), get, steering state, cancel, sessions,
// secrets, interactions and gateways, as tables and as protojson.
func TestU1_TetherctlDrivesARealExecutor(t *testing.T) {
	addr, st := executor(t)
	clearEnv(t, t.TempDir())
	ctl := func(args ...string) (string, error) {
		t.Helper()
		var out bytes.Buffer
		err := runIO(append([]string{"-addr", addr}, args...), strings.NewReader("s3cret\n"), &out)
		return out.String(), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := ctl(args...)
		require.NoError(t, err, "%v: %s", args, out)
		return out
	}

	must("-company", "acme", "secrets", "put", "-name", "openai")
	out := must("secrets", "list", "-company", "acme", "-o", "json")
	var secretsResp executorv1.ListSecretsResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &secretsResp))
	require.Equal(t, "openai", secretsResp.GetSecrets()[0].GetName())

	out = must("-company", "acme", "submit", "-run-id", "a1", "-session", "s1", "-prompt", "hi", "-provider", "acpx", "-provider-agent", "codex", "-permission-mode", "approve-reads",
		"-env", "LOG_LEVEL=debug", "-secret-ref", "OPENAI_API_KEY=openai", "-o", "json")
	var sub executorv1.SubmitRunResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &sub))
	in := sub.GetRun().GetInput()
	require.Equal(t, "acpx", in.GetProvider().GetKind())
	require.Equal(t, "acpx_runtime", in.GetSession().GetDriverKind())
	// A configured variable is sealed as a company secret (SPEC T3) and
	// referenced; the named secret is referenced as given.
	refs := in.GetEnvironment().GetSecretRefs()
	require.Equal(t, "openai", refs["OPENAI_API_KEY"])
	require.Contains(t, refs["LOG_LEVEL"], "env.LOG_LEVEL.")

	// -input-file: a run's input as protojson, with flags on top.
	b, err := protojson.Marshal(in)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "input.json")
	require.NoError(t, os.WriteFile(file, b, 0o600))
	must("submit", "-run-id", "a2", "-input-file", file, "-prompt", "again")
	must("-company", "globex", "submit", "-run-id", "g1", "-session", "s1", "-prompt", "hi")
	out = must("get", "a2", "-o", "json")
	var got executorv1.GetRunResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &got))
	require.Equal(t, "again", got.GetRun().GetInput().GetTask().GetPrompt())
	require.Equal(t, "acme", got.GetRun().GetInput().GetBinding().GetCompanyId())
	require.Equal(t, "acpx", got.GetRun().GetInput().GetProvider().GetKind())

	// list: company filter, a page, then -all.
	out = must("list", "-company", "acme", "-page-size", "1", "-o", "json")
	var page executorv1.ListRunsResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &page))
	require.Len(t, page.GetRuns(), 1)
	require.NotEmpty(t, page.GetNextPageToken())
	out = must("list", "-company", "acme", "-page-size", "1", "-page-token", page.GetNextPageToken(), "-o", "json")
	var page2 executorv1.ListRunsResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &page2))
	require.Equal(t, "a1", page2.GetRuns()[0].GetRunId())
	_, err = ctl("list", "-company", "globex", "-page-token", page.GetNextPageToken())
	require.ErrorContains(t, err, "page_token_filter_mismatch")
	out = must("list", "-all", "-page-size", "1")
	for _, id := range []string{"a1", "a2", "g1"} {
		require.Contains(t, out, id)
	}
	out = must("-company", "globex", "list")
	require.Contains(t, out, "g1")
	require.NotContains(t, out, "a1")

	out = must("steering", "state", "a1")
	require.Contains(t, out, "a1: steering ")
	_, err = ctl("steer", "a1", "-message", "also this")
	require.ErrorContains(t, err, "steering_temporarily_unavailable")

	out = must("cancel", "g1", "-o", "json")
	var cr executorv1.CancelRunResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &cr))

	out = must("-company", "acme", "sessions", "get", "s1", "-o", "json")
	must("sessions", "get", "-company", "acme", "-o", "json", "s1") // the id after the flags too
	var sess executorv1.GetSessionResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &sess))

	out = must("interactions", "list", "-o", "json")
	var ias executorv1.ListInteractionsResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &ias))
	require.Empty(t, ias.GetInteractions())

	for _, id := range []string{"gw-a", "gw-b", "gw-c"} {
		_, err := st.RegisterGateway(context.Background(), store.GatewayAnnouncement{ID: id, Address: id + ":7401", Capacity: 4}, api.DefaultGatewayTTL)
		require.NoError(t, err)
	}
	out = must("gateways", "-page-size", "2", "-all")
	for _, id := range []string{"gw-a", "gw-b", "gw-c"} {
		require.Contains(t, out, id)
	}
	out = must("gateways", "drain", "gw-b", "-reason", "maintenance", "-o", "json")
	var dr executorv1.DrainGatewayResponse
	require.NoError(t, protojson.Unmarshal([]byte(out), &dr))
	require.Equal(t, "maintenance", dr.GetGateway().GetDrain().GetReason())

	// A refused input shows its stable code.
	_, err = ctl("get", "nope")
	require.Equal(t, 1, exitCode(err, io.Discard))
	var w bytes.Buffer
	exitCode(err, &w)
	require.Contains(t, w.String(), "NotFound: run_not_found")
	require.NoError(t, json.Unmarshal([]byte(`{}`), &struct{}{}))
}
