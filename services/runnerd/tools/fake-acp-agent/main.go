// Command fake-acp-agent is a deterministic stand-in for an ACP agent
// (codex-acp or claude-agent-acp) speaking the Agent Client Protocol over
// stdio. The logic and the prompt keywords live in internal/testing/fakeacp.
//
// Like the real agents it does not exit when stdin closes; it ends on a
// signal (the driver kills its process group).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/testing/fakeacp"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--sleep-child" {
		time.Sleep(time.Hour) // the --child process: a member of the group
		return 0
	}
	fs := flag.NewFlagSet("fake-acp-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		opts    fakeacp.Options
		deltaMs = fs.Int("delta-delay-ms", 1, "pause before each chunk, in ms")
		slowMs  = fs.Int("slow-delta-delay-ms", 150, "pause before each chunk of a [slow] reply, in ms")
		child   = fs.Bool("child", false, "start a child process in the agent's process group (its pid goes to the call log)")
		envLog  = fs.String("env-log", "", "write the environment received to this file at startup (sorted KEY=VALUE lines)")
		exitEOF = fs.Bool("exit-on-eof", false, "exit when stdin closes (the real agents do not)")
	)
	fs.StringVar(&opts.Flavor, "flavor", "codex", "codex | claude: modes, permission options and reject semantics")
	fs.StringVar(&opts.StateDir, "state-dir", "", "keep sessions here for session/load (default $HOME/.fake-acp)")
	fs.StringVar(&opts.CallLog, "call-log", "", "append one line per received method to this file")
	fs.BoolVar(&opts.NoLoad, "no-load", false, "initialize reports loadSession false")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if opts.Flavor != "codex" && opts.Flavor != "claude" {
		fmt.Fprintf(stderr, "fake-acp-agent: -flavor must be codex or claude\n")
		return 2
	}
	if opts.StateDir == "" {
		if home := os.Getenv("HOME"); home != "" {
			opts.StateDir = home + "/.fake-acp"
		}
	}
	opts.DeltaDelay = time.Duration(*deltaMs) * time.Millisecond
	opts.SlowDelay = time.Duration(*slowMs) * time.Millisecond
	if *child {
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		opts.Child = []string{self, "--sleep-child"}
	}
	if *envLog != "" {
		env := slices.Clone(os.Environ())
		slices.Sort(env)
		if err := os.WriteFile(*envLog, []byte(strings.Join(env, "\n")+"\n"), 0o600); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	a := fakeacp.New(opts, stdout)
	if err := a.Serve(stdin); err != nil {
		fmt.Fprintf(stderr, "fake-acp-agent: %v\n", err)
	}
	if *exitEOF {
		return 0
	}
	select {} // like the real agents: stdin EOF is not a reason to exit
}
