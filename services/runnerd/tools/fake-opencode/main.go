// Command fake-opencode is a deterministic stand-in for `opencode serve`
// (OpenCode 1.18.17): `fake-opencode [flags] serve --hostname H --port P`
// serves the subset of the OpenCode HTTP + SSE API the runnerd driver uses
// (see internal/testing/fakeopencode). `fake-opencode --version` prints 1.18.17.
//
// Like the real server it reads OPENCODE_CONFIG (model, permission.bash),
// OPENCODE_SERVER_PASSWORD / OPENCODE_SERVER_USERNAME (basic auth) and keeps
// its sessions under $XDG_DATA_HOME/opencode.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-run/tether/services/runnerd/internal/testing/fakeopencode"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fake-opencode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		version  = fs.Bool("version", false, "print the version and exit")
		envLog   = fs.String("env-log", "", "write the environment the process received to this file at startup (sorted KEY=VALUE lines, 0600)")
		callLog  = fs.String("call-log", "", "append process-start and one line per API call to this file")
		state    = fs.String("state-file", "", "session store (default $XDG_DATA_HOME/opencode/fake-opencode.json)")
		deltaMs  = fs.Int("delta-delay-ms", 1, "pause before each text delta, in ms")
		slowMs   = fs.Int("slow-delay-ms", 100, "pause between the deltas of a [slow] reply, in ms")
		dieOnce  = fs.String("die-once-dir", "", "enable the [die:prompt], [die:prompt-recorded] and [die:mid-stream] prompt markers: SIGKILL itself in prompt_async (before or after recording the prompt) or after the reply's first delta, once per prompt (sentinels in this directory)")
		hostname string
		port     int
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, fakeopencode.Version)
		return 0
	}
	rest := fs.Args()
	if len(rest) == 0 || rest[0] != "serve" {
		fmt.Fprintf(stderr, "fake-opencode: only the serve command is implemented (got %q)\n", rest)
		return 2
	}
	sfs := flag.NewFlagSet("serve", flag.ContinueOnError)
	sfs.SetOutput(stderr)
	sfs.StringVar(&hostname, "hostname", "127.0.0.1", "listen address")
	sfs.IntVar(&port, "port", 4096, "listen port (0: any)")
	if err := sfs.Parse(rest[1:]); err != nil {
		return 2
	}
	if err := writeEnvLog(*envLog); err != nil {
		fmt.Fprintln(stderr, "fake-opencode:", err)
		return 1
	}
	opts := fakeopencode.Options{StateFile: *state, CallLog: *callLog,
		Username: os.Getenv("OPENCODE_SERVER_USERNAME"), Password: os.Getenv("OPENCODE_SERVER_PASSWORD"),
		DeltaDelay: time.Duration(*deltaMs) * time.Millisecond, SlowDelay: time.Duration(*slowMs) * time.Millisecond,
		DieOnceDir: *dieOnce}
	if err := completeOptions(&opts); err != nil {
		fmt.Fprintln(stderr, "fake-opencode:", err)
		return 1
	}
	opts.Directory, _ = os.Getwd()
	srv, err := fakeopencode.New(opts)
	if err != nil {
		fmt.Fprintln(stderr, "fake-opencode:", err)
		return 1
	}
	srv.CallLog("process-start pid=" + strconv.Itoa(os.Getpid()))
	return serve(srv, hostname, port, stdout, stderr)
}

// writeEnvLog writes the environment the process received to path
// (sorted KEY=VALUE lines, 0600); nothing when path is empty.
func writeEnvLog(path string) error {
	if path == "" {
		return nil
	}
	env := os.Environ()
	slices.Sort(env)
	return os.WriteFile(path, []byte(strings.Join(env, "\n")+"\n"), 0o600)
}

// completeOptions fills what the environment gives: the default state
// file ($XDG_DATA_HOME/opencode/fake-opencode.json) and, from the
// OPENCODE_CONFIG file, the model and the bash permission.
func completeOptions(opts *fakeopencode.Options) error {
	if opts.StateFile == "" {
		data := os.Getenv("XDG_DATA_HOME")
		if data == "" {
			data = filepath.Join(os.Getenv("HOME"), ".local", "share")
		}
		dir := filepath.Join(data, "opencode")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		opts.StateFile = filepath.Join(dir, "fake-opencode.json")
	}
	if cfg := os.Getenv("OPENCODE_CONFIG"); cfg != "" {
		var c struct {
			Model      string         `json:"model"`
			Permission map[string]any `json:"permission"`
		}
		b, err := os.ReadFile(cfg)
		if err == nil {
			err = json.Unmarshal(b, &c)
		}
		if err != nil {
			return fmt.Errorf("OPENCODE_CONFIG: %w", err)
		}
		opts.Model = c.Model
		opts.Permission, _ = c.Permission["bash"].(string)
	}
	return nil
}

// serve serves srv on hostname:port until SIGTERM or SIGINT.
func serve(srv *fakeopencode.Server, hostname string, port int, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(hostname, strconv.Itoa(port)))
	if err != nil {
		fmt.Fprintln(stderr, "fake-opencode:", err)
		return 1
	}
	fmt.Fprintf(stdout, "opencode server listening on http://%s\n", ln.Addr())
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "fake-opencode:", err)
		return 1
	}
	return 0
}
