// Command runnergw is tether's runner gateway: it launches local runnerd
// processes, authenticates their WebSocket connections and relays PRP events
// and commands between them and executors.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/services/runnergw/internal/api"
	"github.com/tether-run/tether/services/runnergw/internal/gateway"
)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "runnergw:", err)
		os.Exit(1)
	}
}

func defaultStateRoot() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "tether", "runnergw")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "tether", "runnergw")
}

func run() error {
	fs := flag.NewFlagSet("runnergw", flag.ExitOnError)
	cfg := grpcx.RegisterFlags(fs, "runnergw", "127.0.0.1:7401", "127.0.0.1:9401")
	wsAddr := grpcx.StringFlag(fs, "runner-addr", "", "127.0.0.1:7411", "address runners connect to (WebSocket, loopback only in this build)")
	stateRoot := grpcx.StringFlag(fs, "state-root", "", defaultStateRoot(), "directory for runner state, one subdirectory per session scope")
	runnerd := grpcx.StringFlag(fs, "runnerd-path", "", "", "runnerd binary (default: next to this binary, then PATH)")
	codex := grpcx.StringFlag(fs, "codex-command", "", "codex", "provider command runnerd launches (the codex native binary, or fake-codex-app-server)")
	var codexArgs listFlag
	fs.Var(&codexArgs, "codex-arg", "argument for the provider command (repeatable; env TETHER_CODEX_ARGS, space separated)")
	idle := grpcx.DurationFlag(fs, "idle-timeout", "", 10*time.Minute, "how long a warm runner lives without work")
	grace := grpcx.DurationFlag(fs, "reconnect-grace", "", 2*time.Minute, "how long a runner keeps reconnecting before it gives up")
	connectTimeout := grpcx.DurationFlag(fs, "connect-timeout", "", 20*time.Second, "how long an Attach waits for its runner to connect")
	keyFile := grpcx.StringFlag(fs, "runner-auth-key-file", "", "", "HMAC key for runner credentials (default <state-root>/gateway.key, created 0600)")
	if err := grpcx.ParseFlags(fs, os.Args[1:]); err != nil {
		return err
	}
	if len(codexArgs) == 0 {
		if v := os.Getenv("TETHER_CODEX_ARGS"); v != "" {
			codexArgs = strings.Fields(v)
		}
	}
	if !grpcx.IsLoopbackAddr(*wsAddr) {
		return fmt.Errorf("-runner-addr %s: this build accepts runner connections on loopback only (dial_ws_loopback)", *wsAddr)
	}
	if err := os.MkdirAll(*stateRoot, 0o700); err != nil {
		return err
	}
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	rpath, err := findRunnerd(ctx, *runnerd)
	if err != nil {
		return err
	}
	build, err := gateway.ReadBuildMetadata(ctx, rpath, "dial_ws_loopback")
	if err != nil {
		return err
	}
	if *keyFile == "" {
		*keyFile = filepath.Join(*stateRoot, "gateway.key")
	}
	key, err := keyfile.LoadOrCreate(*keyFile)
	if err != nil {
		return err
	}
	srv, err := grpcx.New(*cfg)
	if err != nil {
		return err
	}
	log := srv.Logger()
	lis, err := net.Listen("tcp", *wsAddr)
	if err != nil {
		return err
	}
	gw := gateway.New(gateway.Config{
		StateRoot: *stateRoot, ConnectURL: "ws://" + lis.Addr().String() + gateway.ConnectPath,
		RunnerdPath: rpath, CodexCommand: *codex, CodexArgs: codexArgs,
		IdleTimeout: *idle, ReconnectGrace: *grace, ConnectTimeout: *connectTimeout,
		Build: build, Authority: prp.NewAuthority(key, time.Now), Logger: log, Draining: srv.Draining(),
	})
	gatewayv1.RegisterRunnerGatewayServer(srv.GRPC(), &api.Server{Gateway: gw})
	hs := &http.Server{Handler: gw, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: 16 << 10}
	go func() {
		if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("runner listener failed", "err", err)
		}
	}()
	log.Info("runner listener", "addr", lis.Addr().String(), "runnerd", rpath, "codex_command", *codex)
	err = srv.Serve(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	gw.Close()
	return err
}

// findRunnerd applies G1: a configured (build-owned) runnerd is used as is;
// only when none is configured may the one next to this binary, then a
// preinstalled one (a strict `command -v runnerd` answer), be used.
func findRunnerd(ctx context.Context, p string) (string, error) {
	self, _ := os.Executable()
	path, _, err := gateway.DiscoverRunnerd(ctx, p, self, gateway.ShellWhich)
	return path, err
}
