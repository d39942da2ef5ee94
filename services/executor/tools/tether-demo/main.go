// Command tether-demo stands up tether on loopback — an ephemeral
// PostgreSQL, the backup verifier, the runner gateway and the executor as
// real processes — and runs three warm turns of one session through runnerd
// and the fake codex app-server, printing them live. With -up it keeps the
// stack running for grpcurl until interrupted.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/cli"
	"github.com/tether-run/tether/services/executor/internal/testing/stack"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	self, _ := os.Executable()
	binDir := flag.String("bin-dir", filepath.Dir(self), "directory with the tether binaries")
	up := flag.Bool("up", false, "keep the stack running on fixed ports (-base-port) until interrupted")
	base := flag.Int("base-port", 7400, "with -up: executor, runnergw and backup-verifier gRPC on base+0..2, the runner WebSocket on base+11, the executor's HTTP port (Connect, gRPC-web, the console) on base+80, metrics on base+2000..2002")
	keep := flag.Bool("keep", false, "keep the temporary directory (logs, state)")
	auth := flag.Bool("auth", false, "enforce tenancy (SPEC T1, T2): the executor verifies bearer tokens, and development tokens for companies acme and globex and an operator are written into a printed directory")
	providerName := flag.String("provider", "codex", "provider of the demo's runs: codex (the fake codex), opencode (the real OpenCode 1.18.17) or acpx-codex|acpx-claude (the real ACP agent), the real ones from make test-providers, offline against bin/mock-model")
	openCode := flag.String("opencode-command", "", "with -provider opencode: the opencode binary (default "+defaultOpenCode+")")
	acpModules := flag.String("acp-modules", defaultACPModules, "with -provider acpx-codex|acpx-claude: node_modules holding the pinned ACP agents (make test-providers installs them)")
	flag.Parse()

	ports := upPorts(*base)
	if *up {
		// Before anything starts: a taken port would otherwise let the
		// readiness check be answered by whoever holds it.
		if err := stack.CheckPortsFree(ports); err != nil {
			return err
		}
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	dir, err := os.MkdirTemp("", "tether-demo-")
	if err != nil {
		return err
	}
	defer func() {
		if *keep {
			fmt.Println("demo: kept", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	dsn, closeDB, err := demoDatabase(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	opts := stackOptions(*binDir, dir, dsn, *auth, *up, ports)
	prov, err := setupProvider(ctx, *providerName, *openCode, *acpModules, *binDir, dir, &opts)
	if err != nil {
		return err
	}
	defer prov.stop()
	st, err := stack.New(opts)
	if err != nil {
		return err
	}
	defer st.Stop()
	if err := st.StartAll(ctx); err != nil {
		return err
	}
	fmt.Printf("demo: executor %s, runnergw %s, backup-verifier %s\n", st.Addr("executor"), st.Addr("runnergw"), st.Addr("backup-verifier"))
	if *up {
		return stayUp(ctx, st, ports, dir, dsn, *auth)
	}
	return turns(ctx, st, prov, *auth)
}

// demoDatabase is TETHER_DATABASE_URL, else an ephemeral durable
// PostgreSQL with a tether database (closeDB stops it).
func demoDatabase(ctx context.Context) (dsn string, closeDB func(), _ error) {
	if dsn := os.Getenv("TETHER_DATABASE_URL"); dsn != "" {
		return dsn, func() {}, nil
	}
	cluster, err := pgtest.Start(ctx, pgtest.WithDurable())
	if err != nil {
		return "", nil, fmt.Errorf("starting PostgreSQL: %w", err)
	}
	if err := cluster.CreateDatabase(ctx, "tether"); err != nil {
		cluster.Close()
		return "", nil, err
	}
	fmt.Printf("demo: PostgreSQL on 127.0.0.1:%d (ephemeral)\n", cluster.Port())
	return cluster.DSN("tether"), func() { cluster.Close() }, nil
}

// stackOptions are the demo stack's options: with up, on the fixed ports.
func stackOptions(binDir, dir, dsn string, auth, up bool, ports map[string]int) stack.Options {
	opts := stack.Options{BinDir: binDir, Dir: dir, DatabaseURL: dsn, Auth: auth}
	if up {
		opts.ExecutorPort, opts.GatewayPort, opts.RunnerPort, opts.BackupPort =
			ports["executor gRPC"], ports["runnergw gRPC"], ports["runner WebSocket"], ports["backup-verifier gRPC"]
		opts.HTTP, opts.HTTPPort = true, ports["executor HTTP"]
		opts.MetricsPorts = map[string]int{"executor": ports["executor metrics"],
			"runnergw": ports["runnergw metrics"], "backup-verifier": ports["backup-verifier metrics"]}
	}
	return opts
}

// stayUp (-up) checks that every service stayed up, prints how to reach
// the stack and keeps it running until ctx ends.
func stayUp(ctx context.Context, st *stack.Stack, ports map[string]int, dir, dsn string, auth bool) error {
	for _, n := range []string{"backup-verifier", "runnergw", "executor"} {
		select {
		case <-st.Proc(n).Done():
			return fmt.Errorf("%s exited during start (log: %s)", n, st.LogPath(n))
		default:
		}
	}
	fmt.Printf("demo: metrics on http://127.0.0.1:%d/metrics (executor), :%d (runnergw), :%d (backup-verifier)\n",
		ports["executor metrics"], ports["runnergw metrics"], ports["backup-verifier metrics"])
	fmt.Printf("demo: the API over HTTP (Connect JSON, gRPC-web; docs/api.md) on http://%s, the operator console on http://%[1]s/console/\n", st.HTTPAddr())
	fmt.Printf("demo: stack is up; try `grpcurl -plaintext %s list` — Ctrl-C stops it\n", st.Addr("executor"))
	if auth {
		if err := writeCredentials(st, filepath.Join(dir, "credentials"), os.Stdout); err != nil {
			return err
		}
	}
	fmt.Printf("demo: audit the runs with  bin/tetherctl audit -database-url '%s'\n", dsn)
	fmt.Printf("demo: the gateway serves only grant-signed calls (executor key %s, gateway public key %s), e.g.\n"+
		"  grpcurl -plaintext -H \"tether-grant: $(bin/tetherctl grant -key-file %[1]s)\" %[3]s tether.gateway.v1.RunnerGateway/ListRunners\n",
		st.GrantKeyFile(), st.GrantPublicKeyFile(), st.Addr("runnergw"))
	<-ctx.Done()
	return nil
}

func turns(ctx context.Context, st *stack.Stack, prov *demoProvider, auth bool) error {
	var dialOpts []grpc.DialOption
	if auth {
		tok, err := st.Token("demo", time.Hour, "demo:writer")
		if err != nil {
			return err
		}
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(tenancy.Bearer(tok)))
	}
	conn, err := grpcx.Dial(st.Addr("executor"), "", dialOpts...)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := executorv1.NewExecutorServiceClient(conn)
	prompts := []string{
		"Say hello and remember the word 'tether'.",
		"What word did I ask you to remember?",
		"Summarise our conversation in one line.",
	}
	session := fmt.Sprintf("demo-%d", time.Now().UnixNano())
	var runIDs []string
	events := uint64(0)
	for i, prompt := range prompts {
		runID := fmt.Sprintf("%s-turn-%d", session, i+1)
		in, err := cli.InputSpec{Prompt: prompt, Company: "demo", Agent: "demo-agent", Session: session, Lifecycle: "warm"}.Input()
		if err != nil {
			return err
		}
		prov.apply(in)
		if _, err := client.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: runID, Input: in}); err != nil {
			return err
		}
		fmt.Printf("\n── turn %d: %s\n", i+1, prompt)
		stream, err := client.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: runID})
		if err != nil {
			return err
		}
		r := &cli.Renderer{W: os.Stdout, Prefix: "   "}
		for {
			m, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			r.Event(m)
		}
		r.Flush()
		runIDs = append(runIDs, runID)
	}
	turnsOK := 0
	runners, providerPIDs := map[string]bool{}, map[int32]bool{}
	for _, id := range runIDs {
		resp, err := client.GetRun(ctx, &executorv1.GetRunRequest{RunId: id})
		if err != nil {
			return err
		}
		run := resp.GetRun()
		if run.GetState() == executorv1.RunState_RUN_STATE_SUCCEEDED {
			turnsOK++
		}
		events += run.GetEventCount()
		if p := run.GetRunnerProcess(); p != nil {
			runners[fmt.Sprintf("%d/%d", p.GetPid(), p.GetStartTicks())] = true
		}
		if p := run.GetProviderProcess(); p.GetPid() > 0 {
			providerPIDs[p.GetPid()] = true
		}
	}
	providers := len(providerPIDs)
	if prov.name == "codex" {
		if providers, err = countLines(st.CallLog(), "process-start"); err != nil {
			return err
		}
	}
	fmt.Printf("\ndemo: %d turns, %d runner %s, %d provider %s, %d events\n",
		turnsOK, len(runners), plural(len(runners), "process", "processes"), providers, plural(providers, "process", "processes"), events)
	if turnsOK != len(prompts) || len(runners) != 1 || providers != 1 {
		return fmt.Errorf("expected %d succeeded turns on 1 runner and 1 provider process", len(prompts))
	}
	st.Stop()
	for id := range runners {
		var pid int
		if _, err := fmt.Sscanf(id, "%d/", &pid); err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			return fmt.Errorf("runner process %d is still running after shutdown", pid)
		}
	}
	return nil
}

// upPorts are the fixed ports of -up, by what they serve.
func upPorts(base int) map[string]int {
	return map[string]int{
		"executor gRPC": base, "runnergw gRPC": base + 1, "backup-verifier gRPC": base + 2, "runner WebSocket": base + 11,
		"executor HTTP":    base + 80,
		"executor metrics": base + 2000, "runnergw metrics": base + 2001, "backup-verifier metrics": base + 2002,
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func countLines(path, want string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == want {
			n++
		}
	}
	return n, sc.Err()
}
