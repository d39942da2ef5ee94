package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/provhost"
)

// runProviderHost serves `runnerd provider-host`: it owns one provider
// process and its pipes, outliving runnerd (see the provhost package).
func runProviderHost(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("runnerd provider-host", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg provhost.HostConfig
	fs.StringVar(&cfg.Dir, "dir", "", "runnerd's private runner directory (socket, info, log)")
	fs.StringVar(&cfg.WorkDir, "workdir", "", "provider working directory")
	fs.Uint64Var(&cfg.SeqBase, "seq-base", 0, "the first provider line gets seq base+1")
	fs.DurationVar(&cfg.DetachTimeout, "detach-timeout", 2*time.Minute, "stop the provider after this long without a client")
	fs.DurationVar(&cfg.Grace, "grace", 5*time.Second, "TERM grace when stopping the provider")
	fs.IntVar(&cfg.RetainBytes, "retain-bytes", provhost.DefaultRetainBytes, "replay buffer bound")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if cfg.Dir == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "runnerd provider-host: --dir and a provider command after -- are required")
		return 2
	}
	cfg.Command, cfg.Args = fs.Arg(0), fs.Args()[1:]
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil)).With("component", "provider-host", "pid", os.Getpid())
	if f := os.NewFile(3, "ready"); f != nil {
		cfg.Ready = f
	}
	return provhost.RunHost(cfg)
}

// runProviderShim serves `runnerd provider-shim`: the codex driver's
// stand-in for the provider, connected to the provider host.
func runProviderShim(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runnerd provider-shim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "", "the provider host's socket")
	reattach := fs.Bool("reattach", false, "re-attach to a provider a previous runnerd used")
	resume := fs.Uint64("resume-after", 0, "replay the provider's lines after this host seq")
	if err := fs.Parse(args); err != nil || *socket == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "runnerd provider-shim: --socket is required")
		return provhost.ShimExitBadUsage
	}
	return provhost.RunShim(*socket, *reattach, *resume, stdin, stdout, stderr)
}
