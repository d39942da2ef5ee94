// Command fake-codex-app-server is a deterministic stand-in for
// `codex app-server` (codex-cli 0.169.0) speaking its JSON-RPC over stdio.
// See README.md for flags and behaviour; the logic lives in
// internal/testing/fakecodex.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/services/runnerd/internal/testing/fakecodex"
)

// ignoredValues accepts and drops repeated flags the real binary understands
// (`-c key=value` config overrides) so drivers can pass them unchanged.
type ignoredValues []string

func (v *ignoredValues) String() string     { return strings.Join(*v, ",") }
func (v *ignoredValues) Set(s string) error { *v = append(*v, s); return nil }

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// Accept `fake-codex-app-server app-server [flags]` like `codex app-server`.
	if len(args) > 0 && args[0] == "app-server" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("fake-codex-app-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		opts        fakecodex.Options
		deltaMs     = fs.Int("delta-delay-ms", 2, "pause before each agentMessage delta, in ms (0 allowed)")
		slowDeltaMs = fs.Int("slow-delta-delay-ms", 200, "pause before each delta of a reply to a prompt containing [slow], in ms")
		codexHome   = fs.String("codex-home", "", "codex home reported by initialize (default $CODEX_HOME, else $HOME/.codex)")
		overrides   ignoredValues
		envLog      = fs.String("env-log", "", "write the environment the process received to this file at startup (sorted KEY=VALUE lines, 0600)")
	)
	registerOptions(fs, &opts)
	fs.Var(&overrides, "c", "config override key=value (accepted and ignored)")
	syncTrace := fs.String("sync-trace", "", "benchmarks: record each state save in this directory (pkg/synctrace; the provider's environment is allow-listed, so not by "+synctrace.EnvVar+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *syncTrace != "" {
		_ = os.Setenv(synctrace.EnvVar, *syncTrace)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fake-codex-app-server: unexpected arguments: %q\n", fs.Args())
		return 2
	}
	if *deltaMs < 0 || *slowDeltaMs < 0 {
		fmt.Fprintln(stderr, "fake-codex-app-server: delays must not be negative")
		return 2
	}
	opts.DeltaDelay = time.Duration(*deltaMs) * time.Millisecond
	opts.SlowDeltaDelay = time.Duration(*slowDeltaMs) * time.Millisecond
	opts.CodexHome = *codexHome
	if opts.CodexHome == "" {
		opts.CodexHome = os.Getenv("CODEX_HOME")
	}
	if opts.CodexHome == "" {
		if home, err := os.UserHomeDir(); err == nil {
			opts.CodexHome = filepath.Join(home, ".codex")
		}
	}
	opts.Stderr = stderr
	if *envLog != "" {
		if err := writeEnvLog(*envLog); err != nil {
			fmt.Fprintf(stderr, "fake-codex-app-server: %v\n", err)
			return 1
		}
	}

	return serve(opts, stdin, stdout, stderr)
}

// registerOptions registers the fake's behaviour flags into opts.
func registerOptions(fs *flag.FlagSet, opts *fakecodex.Options) {
	fs.StringVar(&opts.StateFile, "state-file", "", "persist thread history in this JSON file")
	fs.BoolVar(&opts.StateFileInCodexHome, "state-file-in-codex-home", false, "persist thread history in $CODEX_HOME/"+fakecodex.StateFileName)
	fs.BoolVar(&opts.DurableTurnIDs, "durable-turn-ids", false, "turn ids provider-turn-<n> from a counter persisted in the state file")
	fs.BoolVar(&opts.RequireExistingResumeState, "require-existing-resume-state", false, "thread/resume of an unknown thread fails with \"no rollout found for thread id <id>\"")
	fs.StringVar(&opts.CallLog, "call-log", "", "append one line per received method to this file")
	fs.BoolVar(&opts.RecordProcessStart, "record-process-start", false, "append process-start to the call log at startup")
	fs.BoolVar(&opts.HoldTurn, "hold-turn", false, "after the last delta keep the turn open until it is interrupted or steered")
	fs.BoolVar(&opts.ExitAfterTurnStart, "exit-after-turn-start", false, "exit 1 right after the turn/start response")
	fs.BoolVar(&opts.EmitCommandApproval, "emit-command-approval", false, "every turn asks item/commandExecution/requestApproval before its reply ([shell] in a prompt: that turn only)")
	fs.BoolVar(&opts.EmitUserInput, "emit-user-input", false, "every turn asks item/tool/requestUserInput before its reply ([ask] in a prompt: that turn only)")
	fs.BoolVar(&opts.EmitToolCall, "emit-tool-call", false, "every turn calls a dynamic tool (item/tool/call) before its reply ([dyn] in a prompt: that turn only)")
	fs.BoolVar(&opts.EmitToolCallOnResume, "emit-tool-call-on-resume", false, "after each thread/resume send an item/tool/call naming the thread's last stored (inactive) turn")
	fs.StringVar(&opts.DieOnceDir, "die-once-dir", "", "tests only: a prompt containing [die:turn-start|mid-stream|completed] makes the fake SIGKILL itself at that phase, once per phase and prompt (sentinels in this directory)")
}

// serve runs the fake on stdin/stdout until its client goes away; it
// returns the exit code.
func serve(opts fakecodex.Options, stdin io.Reader, stdout, stderr io.Writer) int {
	srv, err := fakecodex.New(opts)
	if err != nil {
		fmt.Fprintf(stderr, "fake-codex-app-server: %v\n", err)
		return 1
	}
	err = srv.Run(context.Background(), stdin, stdout)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, fakecodex.ErrExitAfterTurnStart):
		fmt.Fprintln(stderr, "fake-codex-app-server: exiting after turn/start (--exit-after-turn-start)")
		return 1
	default:
		fmt.Fprintf(stderr, "fake-codex-app-server: %v\n", err)
		return 1
	}
}

// writeEnvLog records the environment the provider process was started
// with, so a test can prove what reached it (SPEC E2).
func writeEnvLog(path string) error {
	env := os.Environ()
	slices.Sort(env)
	return os.WriteFile(path, []byte(strings.Join(env, "\n")+"\n"), 0o600)
}
