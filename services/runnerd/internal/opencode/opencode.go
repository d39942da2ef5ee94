// Package opencode is runnerd's OpenCode driver (SPEC R10): one
// `opencode serve` per session scope, driven over its HTTP + server-sent
// events API (reference/opencode-acpx.md §3).
//
// Layout: the server's home is the scope root's opencode/ directory
// (ProviderConfig.StateDir/opencode), the B2 persistence profile "opencode":
//
//	opencode/data/     XDG_DATA_HOME: OpenCode's database (sessions, history) — backed up
//	opencode/state/    XDG_STATE_HOME — backed up
//	opencode/config/   XDG_CONFIG_HOME: the operator's opencode.json (provider definitions, may hold keys)
//	                   and the seeded package files that stop OpenCode's registry install — never backed up
//	opencode/cache/    XDG_CACHE_HOME — never backed up
//	opencode/tether.json  OPENCODE_CONFIG: model, permission, autoupdate/share off — rewritten each start
//	opencode/server.json  the live server (pid, port, basic-auth password) — never backed up
//	opencode/serve.log    the server's stdout and stderr
//
// The server listens on 127.0.0.1 on its own port with HTTP basic auth (a
// fresh random password per start). It runs in its own process group and
// outlives a runnerd crash: a restarted runnerd re-attaches to it through
// server.json and reconciles the active turn from the session's history
// (the event stream does not replay what was missed).
//
// A tether turn is one prompt on the OpenCode session; its turn id is the
// user message id tether chooses (an OpenCode ascending id), so the turn
// can be found in the history after any restart. Events:
//
//	session.started          P0 {threadId, providerSessionId, resumed, model}
//	turn.started             P0 {providerTurnId}
//	item.started             P1 {kind:"agentMessage"|"commandExecution"|"toolCall", itemId[, tool, status]}
//	item.delta               P2 {kind:"agentMessage", delta}
//	item.completed           P1 {kind, itemId[, text, status, exitCode, tool, error]}
//	usage.reported           P1 {total, last, costUsd} (per finished assistant message)
//	turn.completed|failed|interrupted P0 {status, finalMessage, usage, costUsd[, error], reconciled?}
//	runtime_request.*        permission.asked → command/file-change approval (see requests.go)
package opencode

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/services/runnerd/internal/opencode/opencodewire"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// HomeDir is the profile directory under the scope root (SPEC B2).
const HomeDir = durable.OpenCodeHomeDir

// BackupExclusions are the directories of the home that never travel in a backup (credentials,
// scratch, the live server's password); see the package comment.
var BackupExclusions = durable.LaunchOnlyOpenCodeEntries

// Username is the basic-auth user of the server.
const Username = "tether"

// serverFile records the live server for a re-attach.
type serverFile struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"startTicks"`
	Port       int    `json:"port"`
	Password   string `json:"password"`
	StartedAt  time.Time
}

// Session is one driven OpenCode server and session (provider.Provider).
type Session struct {
	cfg  provider.Config
	log  *slog.Logger
	emit func(provider.Event)
	home string
	base string
	pass string
	hc   *http.Client
	proc provider.ProcessInfo
	cmd  *exec.Cmd // nil when re-attached

	evCancel context.CancelFunc
	evDone   chan struct{}

	// instance names this driver's re-announced requests.
	instance string

	emitMu sync.Mutex // orders events and turn results
	mu     sync.Mutex
	sesID  string
	turn   *turnState
	total  provider.Usage
	seen   map[string]bool // assistant messages counted in total
	perms  map[string]*permRequest
	closed bool

	done      chan provider.TurnResult
	exited    chan struct{}
	exitOnce  sync.Once
	exitErr   error
	watchDone chan struct{}
}

// Start starts (or, with cfg.Reattach, re-attaches to) the scope's
// OpenCode server. It is runnerd's StartFunc for the "opencode" profile.
func Start(ctx context.Context, cfg provider.Config, emit func(provider.Event)) (provider.Provider, error) {
	s := &Session{cfg: cfg, emit: emit, home: filepath.Join(cfg.StateDir, HomeDir), perms: map[string]*permRequest{}, seen: map[string]bool{},
		done: make(chan provider.TurnResult, 16), exited: make(chan struct{}), watchDone: make(chan struct{}),
		hc: &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}}}
	s.instance = randomPassword()[:8]
	s.log = cfg.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if cfg.StartupTimeout <= 0 {
		s.cfg.StartupTimeout = 60 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		s.cfg.RequestTimeout = 60 * time.Second
	}
	var err error
	if cfg.Reattach {
		err = s.reattach()
	} else {
		err = s.spawn(ctx)
	}
	if err != nil {
		return nil, err
	}
	if err := s.subscribe(ctx); err != nil {
		s.kill()
		return nil, err
	}
	return s, nil
}

func perr(code, format string, args ...any) error {
	return &provider.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// prepareHome creates the home, seeds the config directory so OpenCode's
// background plugin install finds nothing to do (no registry connection),
// copies the operator's opencode.json and writes tether's own config.
func (s *Session) prepareHome() (configPath string, err error) {
	cfgDir := filepath.Join(s.home, "config", "opencode")
	for _, d := range []string{cfgDir, filepath.Join(cfgDir, "node_modules"), filepath.Join(s.home, "data"),
		filepath.Join(s.home, "cache"), filepath.Join(s.home, "state")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return "", err
		}
	}
	seed := map[string]string{
		"package.json":      `{"dependencies":{"@opencode-ai/plugin":"*"}}`,
		"package-lock.json": `{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}`,
	}
	for name, body := range seed {
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(body+"\n"), 0o600); err != nil {
			return "", err
		}
	}
	if t := s.cfg.HomeTemplate; t != "" {
		b, err := os.ReadFile(filepath.Join(t, "opencode.json"))
		if err != nil {
			return "", fmt.Errorf("provider home template: %w", err)
		}
		if err := os.WriteFile(filepath.Join(cfgDir, "opencode.json"), b, 0o600); err != nil {
			return "", err
		}
	}
	tcfg := opencodewire.Config{Schema: "https://opencode.ai/config.json", Share: "disabled"}
	if m := s.cfg.Model; m != "" {
		tcfg.Model, tcfg.SmallModel = m, m
		if p, _, ok := strings.Cut(m, "/"); ok {
			tcfg.EnabledProviders = []string{p}
		}
	}
	if mode := s.cfg.PermissionMode; mode != "" {
		tcfg.Permission = &opencodewire.PermissionConfig{Bash: mode, Edit: mode, Webfetch: mode}
	}
	b, _ := json.MarshalIndent(tcfg, "", "  ")
	return filepath.Join(s.home, "tether.json"), atomicfile.Write(s.home, "tether.json", b, 0o600)
}

// env is the server's environment: the run's allow-listed environment
// (SPEC E2) with the home, the offline switches and the server's
// credentials set by the driver.
func (s *Session) env(configPath string) []string {
	set := map[string]string{
		"HOME":                             s.home,
		"XDG_CONFIG_HOME":                  filepath.Join(s.home, "config"),
		"XDG_DATA_HOME":                    filepath.Join(s.home, "data"),
		"XDG_CACHE_HOME":                   filepath.Join(s.home, "cache"),
		"XDG_STATE_HOME":                   filepath.Join(s.home, "state"),
		"OPENCODE_CONFIG":                  configPath,
		"OPENCODE_DISABLE_PROJECT_CONFIG":  "1",
		"OPENCODE_DISABLE_AUTOUPDATE":      "1",
		"OPENCODE_DISABLE_MODELS_FETCH":    "1",
		"OPENCODE_DISABLE_SHARE":           "1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD":    "1",
		"OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
		"OPENCODE_DISABLE_CLAUDE_CODE":     "1",
		"OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
		"OPENCODE_DISABLE_EMBEDDED_WEB_UI": "1",
		"OPENCODE_SERVER_USERNAME":         Username,
		"OPENCODE_SERVER_PASSWORD":         s.pass,
		"OPENCODE_CONFIG_CONTENT":          "",
		"OPENCODE_PERMISSION":              "",
		"OPENCODE_CONFIG_DIR":              "",
	}
	var out []string
	for _, kv := range s.cfg.Env {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; !ours {
			out = append(out, kv)
		}
	}
	for k, v := range set {
		if v != "" {
			out = append(out, k+"="+v)
		}
	}
	return out
}

// Ports the server is offered: below Linux's default ephemeral range
// (32768–60999), from which the kernel picks the port of every outgoing
// connection and of every listener on port 0.
const (
	serverPortMin = 10000
	serverPortMax = 32767
)

// freePort returns a loopback port that was free a moment ago, for the
// server to listen on. Between this check and the server's bind another
// process may take it; a port outside the ephemeral range is one only
// another explicit choice can take (under load, a port the kernel handed
// out as ephemeral was taken by the next outgoing connection often enough
// to fail a start: "opencode serve exited before it was ready"). Falls back
// to the kernel's choice when no port in the range is free.
func freePort() (int, error) {
	for range 32 {
		p := serverPortMin + mrand.IntN(serverPortMax-serverPortMin+1)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomPassword() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// spawn starts a new server (stopping one a previous runnerd left).
func (s *Session) spawn(ctx context.Context) error {
	if old, err := readServerFile(s.home); err == nil && procid.Alive(old.PID, old.StartTicks, "") {
		procgroup.Kill(old.PID)
	}
	configPath, err := s.prepareHome()
	if err != nil {
		return perr(failure.ProviderSpawnFailed, "preparing the OpenCode home: %v", err)
	}
	port, err := freePort()
	if err != nil {
		return perr(failure.ProviderSpawnFailed, "no free loopback port: %v", err)
	}
	s.pass = randomPassword()
	args := append(append([]string(nil), s.cfg.Args...), "serve", "--hostname", "127.0.0.1", "--port", strconv.Itoa(port))
	logf, err := os.OpenFile(filepath.Join(s.home, "serve.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return perr(failure.ProviderSpawnFailed, "opening serve.log: %v", err)
	}
	cmd := exec.Command(s.cfg.Command, args...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.cfg.Dir, s.env(configPath), logf, logf
	if err := procgroup.Start(cmd); err != nil {
		logf.Close()
		return perr(failure.ProviderSpawnFailed, "starting %s: %v", s.cfg.Command, err)
	}
	logf.Close()
	s.cmd = cmd
	pid := cmd.Process.Pid
	ticks, _ := procid.StartTicks(pid)
	s.proc = provider.ProcessInfo{PID: pid, PGID: pid, StartTicks: ticks, StartedAt: time.Now()}
	s.base = "http://127.0.0.1:" + strconv.Itoa(port)
	waited := make(chan struct{})
	go func() {
		werr := cmd.Wait()
		desc := procid.DescribeExit(cmd.ProcessState)
		if werr != nil && cmd.ProcessState == nil {
			desc = werr.Error()
		}
		close(waited)
		s.fail(perr(failure.ProviderProcessExited, "opencode serve (pid %d) %s", pid, desc))
		close(s.watchDone)
	}()
	sf := serverFile{PID: pid, StartTicks: ticks, Port: port, Password: s.pass, StartedAt: s.proc.StartedAt}
	b, _ := json.Marshal(sf)
	if err := atomicfile.Write(s.home, "server.json", b, 0o600); err != nil {
		s.kill()
		return perr(failure.ProviderSpawnFailed, "writing server.json: %v", err)
	}
	if err := s.awaitReady(ctx, waited); err != nil {
		s.kill()
		return err
	}
	return nil
}

// awaitReady waits until the server answers an authenticated request.
func (s *Session) awaitReady(ctx context.Context, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartupTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// Each probe has its own bound: a request the server accepts while
		// it is still starting may never be answered (observed with
		// OpenCode 1.18.17 on a loaded machine).
		var st map[string]opencodewire.Status
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.call(pctx, http.MethodGet, "/session/status", nil, &st)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return perr(failure.ProviderProcessExited, "opencode serve exited before it was ready: %v (see %s)", s.ExitErr(), filepath.Join(s.home, "serve.log"))
		case <-ctx.Done():
			return perr(failure.ProviderInitializeTimeout, "opencode serve did not answer within %s: %v", s.cfg.StartupTimeout, err)
		case <-tick.C:
		}
	}
}

func readServerFile(home string) (serverFile, error) {
	var sf serverFile
	b, err := os.ReadFile(filepath.Join(home, "server.json"))
	if err == nil {
		err = json.Unmarshal(b, &sf)
	}
	return sf, err
}

// reattach connects to the server a previous runnerd left running.
func (s *Session) reattach() error {
	sf, err := readServerFile(s.home)
	if err != nil || !procid.Alive(sf.PID, sf.StartTicks, "") {
		return perr(failure.ProviderProcessLost, "the OpenCode server of the previous runnerd is gone")
	}
	s.pass, s.base = sf.Password, "http://127.0.0.1:"+strconv.Itoa(sf.Port)
	s.proc = provider.ProcessInfo{PID: sf.PID, PGID: sf.PID, StartTicks: sf.StartTicks, StartedAt: sf.StartedAt}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RequestTimeout)
	defer cancel()
	var st map[string]opencodewire.Status
	if err := s.call(ctx, http.MethodGet, "/session/status", nil, &st); err != nil {
		return perr(failure.ProviderProcessLost, "the OpenCode server of the previous runnerd does not answer: %v", err)
	}
	// Not our child: watch its identity.
	go func() {
		defer close(s.watchDone)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.exited:
				return
			case <-t.C:
				if !procid.Alive(sf.PID, sf.StartTicks, "") {
					s.fail(perr(failure.ProviderProcessExited, "opencode serve (pid %d) exited", sf.PID))
					return
				}
			}
		}
	}()
	return nil
}

// call does one authenticated JSON request; out may be nil.
func (s *Session) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(Username, s.pass)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode/100 != 2 {
		return &httpError{status: resp.StatusCode, body: strings.TrimSpace(string(b))}
	}
	if out != nil && len(bytes.TrimSpace(b)) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

type httpError struct {
	status int
	body   string
}

func (e *httpError) Error() string {
	if len(e.body) > 512 {
		e.body = e.body[:512]
	}
	return fmt.Sprintf("HTTP %d: %s", e.status, e.body)
}

func isHTTPError(err error) bool {
	var he *httpError
	return errors.As(err, &he)
}

func isNotFound(err error) bool {
	var he *httpError
	return errors.As(err, &he) && he.status == http.StatusNotFound
}

// subscribe opens the event stream and returns once the server said
// server.connected, so no event of a later call is missed.
func (s *Session) subscribe(ctx context.Context) error {
	ectx, cancel := context.WithCancel(context.Background())
	s.evCancel = cancel
	s.evDone = make(chan struct{})
	req, err := http.NewRequestWithContext(ectx, http.MethodGet, s.base+"/event", nil)
	if err != nil {
		cancel()
		return perr(failure.ProviderTransportFailed, "%v", err)
	}
	req.SetBasicAuth(Username, s.pass)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.hc.Do(req)
	if err != nil {
		cancel()
		return perr(failure.ProviderTransportFailed, "opening the OpenCode event stream: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return perr(failure.ProviderTransportFailed, "opening the OpenCode event stream: HTTP %d", resp.StatusCode)
	}
	connected := make(chan struct{})
	go s.readEvents(resp.Body, connected)
	select {
	case <-connected:
		return nil
	case <-s.evDone:
		return perr(failure.ProviderTransportFailed, "the OpenCode event stream ended before server.connected")
	case <-ctx.Done():
		cancel()
		return perr(failure.ProviderInitializeTimeout, "no server.connected on the OpenCode event stream: %v", ctx.Err())
	}
}

// readEvents reads data: lines until the stream ends; an end the driver
// did not ask for fails the session (the server died or dropped us).
func (s *Session) readEvents(body io.ReadCloser, connected chan struct{}) {
	defer close(s.evDone)
	defer body.Close()
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	once := sync.Once{}
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		var ev opencodewire.Event
		if err := json.Unmarshal([]byte(strings.TrimSpace(line)), &ev); err != nil {
			continue
		}
		if ev.Type == opencodewire.EventServerConnected {
			once.Do(func() { close(connected) })
			continue
		}
		s.onEvent(ev.Type, ev.Properties)
	}
	s.mu.Lock()
	closing := s.closed
	s.mu.Unlock()
	if !closing {
		// Give the exit watcher the chance to name the cause.
		select {
		case <-s.watchDone:
		case <-time.After(2 * time.Second):
			s.fail(perr(failure.ProviderTransportFailed, "the OpenCode event stream ended: %v", sc.Err()))
		}
	}
}

// fail ends the session and closes Exited. An active turn of a server
// that was lost (its process exited, its event stream ended) is left to
// runnerd, which restarts the server and reconciles the turn from the
// session's history (SPEC R7): no turn.failed and no TurnResult, as the
// codex driver does with ReconcileOnExit. Any other end (Close) fails it.
func (s *Session) fail(err error) {
	s.exitOnce.Do(func() {
		s.emitMu.Lock()
		s.mu.Lock()
		s.exitErr = err
		t := s.turn
		s.turn = nil
		s.mu.Unlock()
		if t != nil {
			s.expireRequests(failure.ProviderProcessLost)
		}
		if t != nil && !lostServer(err) {
			s.emitEv("turn.failed", t.id, "", provider.P0, map[string]any{"status": "failed", "finalMessage": t.final,
				"error": map[string]any{"code": provider.ErrorCode(err), "message": err.Error()}})
			s.deliver(provider.TurnResult{TurnID: t.id, Status: "failed", FinalMessage: t.final, Usage: t.usage,
				ErrorCode: provider.ErrorCode(err), ErrorMessage: err.Error()})
		}
		s.emitMu.Unlock()
		close(s.exited)
	})
}

// lostServer reports whether err is the loss of the server (not a close):
// its turn is reconciled by runnerd on a restarted server.
func lostServer(err error) bool {
	switch provider.ErrorCode(err) {
	case failure.ProviderProcessExited, failure.ProviderTransportFailed:
		return true
	}
	return false
}

func (s *Session) deliver(r provider.TurnResult) {
	select {
	case s.done <- r:
	default:
		s.log.Warn("opencode: turn result buffer full; dropped", "turn", r.TurnID)
	}
}

func (s *Session) emitEv(typ, turnID, itemID string, prio uint32, payload map[string]any) {
	s.emit(provider.Event{Type: typ, TurnID: turnID, ItemID: itemID, Priority: prio, Payload: payload})
}

// emitBody emits an event with a typed payload.
func (s *Session) emitBody(typ, turnID, itemID string, prio uint32, body proto.Message) {
	s.emit(provider.Event{Type: typ, TurnID: turnID, ItemID: itemID, Priority: prio, Body: body})
}

// kill stops the server's process group at once.
func (s *Session) kill() {
	procgroup.Kill(s.proc.PGID)
	if s.evCancel != nil {
		s.evCancel()
	}
}

// Process reports the server process.
func (s *Session) Process() provider.ProcessInfo { return s.proc }

// Exited is closed when the server is gone.
func (s *Session) Exited() <-chan struct{} { return s.exited }

// ExitErr is why.
func (s *Session) ExitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// TurnDone delivers finished turns.
func (s *Session) TurnDone() <-chan provider.TurnResult { return s.done }

// Close stops the server: SIGTERM to its group, SIGKILL after grace.
func (s *Session) Close(ctx context.Context, grace time.Duration) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if s.proc.PGID > 0 && procid.Alive(s.proc.PID, s.proc.StartTicks, "") {
		procgroup.Stop(ctx, s.proc.PGID, s.watchDone, grace)
	}
	if s.evCancel != nil {
		s.evCancel()
		<-s.evDone
	}
	s.fail(perr(failure.ProviderClosed, "the OpenCode server was closed"))
	if s.cmd != nil {
		<-s.watchDone
	}
	_ = os.Remove(filepath.Join(s.home, "server.json"))
	return nil
}
