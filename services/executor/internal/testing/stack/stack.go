// Package stack starts tether's services as real processes on loopback: the
// executor, the runner gateway (which launches runnerd and the provider) and
// the backup verifier. The demo and the integration tests share it.
package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tether-run/tether/pkg/devpki"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/tenancy"
)

// Binaries the stack needs in BinDir.
var Binaries = []string{"executor", "runnergw", "backup-verifier", "runnerd", "fake-codex-app-server"}

// Options configures a stack.
type Options struct {
	// BinDir holds the Binaries.
	BinDir string
	// Dir is the stack's private directory (state, logs, call log).
	Dir string
	// DatabaseURL is the executor's database.
	DatabaseURL string
	// Ports; zero picks a free loopback port.
	ExecutorPort, GatewayPort, RunnerPort, BackupPort int
	// HTTP: the executor also serves its HTTP port (-http-addr: Connect,
	// gRPC-web and the console, SPEC U3/U4) on HTTPPort (zero: a free
	// loopback port); HTTPAddr names it.
	HTTP     bool
	HTTPPort int
	// MetricsPorts: a service named here serves /metrics and /healthz on
	// 127.0.0.1:<port>; the others serve none.
	MetricsPorts map[string]int
	// FakeArgs are extra fake-codex-app-server flags (e.g. --delta-delay-ms).
	FakeArgs []string
	// NoCallLog starts the fake without the stack's shared call log (a
	// confined provider cannot reach the stack's directory, SPEC T7).
	NoCallLog bool
	// CodexCommand, when set, is the gateways' -codex-command instead of
	// the fake (the real codex of make test-providers), with CodexArgs as
	// its only -codex-args (FakeArgs are not used).
	CodexCommand string
	CodexArgs    []string
	// LeaseTTL for the executor (default 10s).
	LeaseTTL time.Duration
	// CheckpointAfter is the executors' -checkpoint-after; zero turns it
	// off (suspension only at a session's idle timeout), so a test's warm
	// session keeps its provider between turns however slow the machine.
	CheckpointAfter time.Duration
	// ExecutorArgs / GatewayArgs are extra flags.
	ExecutorArgs, GatewayArgs []string
	// MTLS serves every service over mutual TLS with identities from a
	// development PKI in the stack's directory (SPEC S2), as off loopback;
	// the executor then requires caller identities (SPEC T1): DialAs with
	// Operator presents an operator's certificate.
	MTLS bool
	// Auth has the executor verify bearer tokens against a JWKS the stack
	// writes (SPEC T1, tenancy enforced on loopback); Token mints them.
	Auth bool
	// Env holds extra KEY=VALUE entries of every service's environment
	// (e.g. a host secret that must not reach the provider).
	Env []string
	// Migrated: DatabaseURL holds the executor's and the backup
	// verifier's schema already (a test database cloned from a migrated
	// template), so they start with -migrate=false instead of each
	// opening a connection of its own to check every migration again.
	Migrated bool
}

// Stack is a running set of tether processes.
type Stack struct {
	opts  Options
	mu    sync.Mutex
	procs map[string]*Proc
	ports map[string]int // extra executors: "executor-2", ...
	extra map[string][]string
	// binaries: processes that run another binary than BinDir's.
	binaries map[string]string
	// pidNS: services started in a PID namespace of their own.
	pidNS map[string]bool
}

// Proc is one service process (in its own process group).
type Proc struct {
	Name string
	Addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Kill sends SIGKILL to the process (not its group: runners it launched
// live on, as they would after a crash) and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs the group.
func (p *Proc) Stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		procgroup.Kill(p.cmd.Process.Pid)
		<-p.done
	}
}

// FreePort returns a free loopback TCP port for a process to bind later.
// It is chosen below the kernel's ephemeral range, so that no outgoing
// connection (of this stack or of any other program) can be given the port
// between now and the bind, and it is never handed out twice by this
// process (parallel tests start stacks at the same time).
func FreePort() (int, error) {
	low := ephemeralLow()
	const first = 10000
	handed.Lock()
	defer handed.Unlock()
	if handed.ports == nil {
		handed.ports = map[int]bool{}
	}
	for range 200 {
		p := first + rand.IntN(max(low-first, 1))
		if handed.ports[p] {
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		_ = l.Close()
		handed.ports[p] = true
		return p, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var handed struct {
	sync.Mutex
	ports map[int]bool
}

// ephemeralLow is the first port of the kernel's range for outgoing
// connections (Linux default 32768).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 10000 {
				return n
			}
		}
	}
	return 32768
}

// CheckPortsFree fails, naming the first port taken, unless every port
// (what it is for → port) can be bound on 127.0.0.1 now: a stack on fixed
// ports must not report itself up while another stack answers there.
func CheckPortsFree(ports map[string]int) error {
	names := make([]string, 0, len(ports))
	for n := range ports {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		addr := "127.0.0.1:" + strconv.Itoa(ports[n])
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s %s is already in use (another tether stack, e.g. a running `make up`, or another program holds it): stop it or choose other ports: %w", n, addr, err)
		}
		_ = l.Close()
	}
	return nil
}

// New prepares a stack; Start* launch its processes.
func New(opts Options) (*Stack, error) {
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = 10 * time.Second
	}
	ports := []*int{&opts.ExecutorPort, &opts.GatewayPort, &opts.RunnerPort, &opts.BackupPort}
	if opts.HTTP {
		ports = append(ports, &opts.HTTPPort)
	}
	for _, p := range ports {
		if *p == 0 {
			port, err := FreePort()
			if err != nil {
				return nil, err
			}
			*p = port
		}
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s missing in %s (run make build): %w", b, opts.BinDir, err)
		}
	}
	for _, d := range []string{"logs", "runners", "keys", "backup-blobs", "backup-staging"} {
		if err := os.MkdirAll(filepath.Join(opts.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	// Grants stay on in development: the stack's executors sign with a
	// key pair of its own, its gateway trusts that pair's public key.
	st := &Stack{opts: opts, procs: map[string]*Proc{}, ports: map[string]int{}, extra: map[string][]string{}, pidNS: map[string]bool{}}
	if _, err := os.Stat(st.GrantKeyFile()); os.IsNotExist(err) {
		if _, err := grant.WriteKeyPair(st.GrantKeyFile(), st.GrantPublicKeyFile()); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(filepath.Join(st.PKIDir(), devpki.CAFile)); opts.MTLS && os.IsNotExist(err) {
		if err := devpki.InitDev(st.PKIDir(), nil, 0); err != nil {
			return nil, err
		}
		if err := devpki.IssueDev(st.PKIDir(), Operator, []*url.URL{tenancy.OperatorURI(Operator)}, 0); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(st.tokenKeyFile()); opts.Auth && os.IsNotExist(err) {
		if err := tenancy.WriteSigningKey(st.tokenKeyFile(), st.JWKSFile()); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Operator is the development operator's certificate in an MTLS stack
// (DialAs(addr, Operator)) and its principal name.
const Operator = tenancy.OperatorName

// JWKSFile is the executors' -auth-jwks in an Auth stack.
func (s *Stack) JWKSFile() string {
	return filepath.Join(s.opts.Dir, "keys", "tokens", tenancy.JWKSFile)
}

func (s *Stack) tokenKeyFile() string {
	return filepath.Join(s.opts.Dir, "keys", "tokens", tenancy.SigningKeyFile)
}

// TokenKeyFile is the signing key of an Auth stack's tokens.
func (s *Stack) TokenKeyFile() string { return s.tokenKeyFile() }

// Token mints a bearer token (valid ttl) for subject with grants
// ("acme:writer", "operator") in an Auth stack.
func (s *Stack) Token(subject string, ttl time.Duration, grants ...string) (string, error) {
	m, err := tenancy.LoadMinter(s.tokenKeyFile())
	if err != nil {
		return "", err
	}
	return m.Mint(subject, grants, ttl, time.Now())
}

// Dir is the stack's private directory.
func (s *Stack) Dir() string { return s.opts.Dir }

// PKIDir holds the development CA and service certificates of an MTLS
// stack.
func (s *Stack) PKIDir() string { return filepath.Join(s.opts.Dir, "keys", "pki") }

// DialAs connects to addr as role: over mTLS with role's certificate in an
// MTLS stack, plaintext on loopback otherwise.
func (s *Stack) DialAs(addr, role string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if !s.opts.MTLS {
		return grpcx.Dial(addr, "", opts...)
	}
	c := grpcx.Config{TLSCertFile: devpki.CertFile(s.PKIDir(), role), TLSKeyFile: devpki.KeyFile(s.PKIDir(), role)}
	return c.DialPeer(addr, filepath.Join(s.PKIDir(), devpki.CAFile), opts...)
}

// tlsArgs are a service's mTLS flags in an MTLS stack.
func (s *Stack) tlsArgs(role string, peerCAFlags ...string) []string {
	if !s.opts.MTLS {
		return nil
	}
	ca := filepath.Join(s.PKIDir(), devpki.CAFile)
	a := []string{"-tls-cert", devpki.CertFile(s.PKIDir(), role), "-tls-key", devpki.KeyFile(s.PKIDir(), role), "-tls-client-ca", ca}
	for _, f := range peerCAFlags {
		a = append(a, f, ca)
	}
	return a
}

// GatewayID is the stack gateway's id (the audience of its grants).
const GatewayID = "runnergw"

// SecretsKeyFile is the executors' -secrets-key-file (SPEC T3), shared
// by every replica.
func (s *Stack) SecretsKeyFile() string { return filepath.Join(s.opts.Dir, "keys", "secrets.key") }

// GrantKeyFile is the executors' grant signing key.
func (s *Stack) GrantKeyFile() string { return filepath.Join(s.opts.Dir, "keys", "grant.key") }

// GrantPublicKeyFile is the public key the gateway verifies grants with.
func (s *Stack) GrantPublicKeyFile() string { return filepath.Join(s.opts.Dir, "keys", "grant.pub") }

// GatewayClient is a client of the stack's gateway that signs a grant for
// every call, as the stack's executors do.
func (s *Stack) GatewayClient(conn grpc.ClientConnInterface) (gatewayv1.RunnerGatewayClient, error) {
	key, err := grant.LoadSigningKey(s.GrantKeyFile())
	if err != nil {
		return nil, err
	}
	return grant.Client(gatewayv1.NewRunnerGatewayClient(conn), grant.NewSigner(key, 0, nil), GatewayID), nil
}

// Addr returns a service's gRPC address.
func (s *Stack) Addr(name string) string {
	port, ok := map[string]int{"executor": s.opts.ExecutorPort, "runnergw": s.opts.GatewayPort, "backup-verifier": s.opts.BackupPort}[name]
	if !ok {
		s.mu.Lock()
		port = s.ports[name]
		s.mu.Unlock()
	}
	return "127.0.0.1:" + strconv.Itoa(port)
}

// HTTPAddr is the executor's HTTP address (host:port) in a stack with
// Options.HTTP; "" without.
func (s *Stack) HTTPAddr() string {
	if !s.opts.HTTP {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(s.opts.HTTPPort)
}

// AddExecutor registers another executor replica (its own port, owner id
// and extra flags) for Start; name must start with "executor-".
func (s *Stack) AddExecutor(name string, extraArgs ...string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ports[name] = port
	s.extra[name] = extraArgs
	s.mu.Unlock()
	return nil
}

// AddGateway registers another runner gateway (as on another host: its
// own gRPC and runner ports, its own state root, gateway id name) for
// Start; name must start with "runnergw-".
func (s *Stack) AddGateway(name string, extraArgs ...string) error {
	grpcPort, err := FreePort()
	if err != nil {
		return err
	}
	runnerPort, err := FreePort()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.RunnerStateRootOf(name), 0o700); err != nil {
		return err
	}
	s.mu.Lock()
	s.ports[name] = grpcPort
	s.ports[name+"/runner"] = runnerPort
	s.extra[name] = extraArgs
	s.mu.Unlock()
	return nil
}

// RegistryArgs are the flags that make a gateway announce itself to the
// named executors (SPEC F1).
func (s *Stack) RegistryArgs(executors ...string) []string {
	addrs := make([]string, len(executors))
	for i, e := range executors {
		addrs[i] = s.Addr(e)
	}
	a := []string{"-registry-addr", strings.Join(addrs, ",")}
	if s.opts.MTLS {
		a = append(a, "-registry-ca", filepath.Join(s.PKIDir(), devpki.CAFile))
	}
	return a
}

// SetBinary has the named process run the binary at path from its next
// Start on, instead of BinDir's (e.g. an executor of the previous release in
// the rolling-upgrade test, SPEC L3); "" goes back to BinDir's. Flags the
// binary does not list in its -h are left out of its arguments (a newer
// flag an older binary would refuse).
func (s *Stack) SetBinary(name, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.binaries == nil {
		s.binaries = map[string]string{}
	}
	if path == "" {
		delete(s.binaries, name)
		return
	}
	s.binaries[name] = path
}

// knownFlags keeps of args the flags bin lists in its -h output (with
// their values).
func knownFlags(bin string, args []string) ([]string, error) {
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	known := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "-") {
			known[strings.TrimPrefix(f[0], "-")] = true
		}
	}
	if len(known) == 0 {
		return nil, fmt.Errorf("%s -h lists no flags: %s", bin, out)
	}
	var kept []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, inline := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		hasValue := !inline && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-")
		if known[name] {
			kept = append(kept, a)
			if hasValue {
				kept = append(kept, args[i+1])
			}
		}
		if hasValue {
			i++
		}
	}
	return kept, nil
}

// SetExtraArgs sets extra flags for a service's next Start.
func (s *Stack) SetExtraArgs(name string, args ...string) {
	s.mu.Lock()
	s.extra[name] = args
	s.mu.Unlock()
}

// SetOwnPIDNamespace makes the service's next Start run it in a new PID
// namespace, where it is pid 1, as in a container on this host (the host's
// /proc stays mounted). As root that is all; otherwise in a new user
// namespace too, mapping its root to the caller.
func (s *Stack) SetOwnPIDNamespace(name string) {
	s.mu.Lock()
	s.pidNS[name] = true
	s.mu.Unlock()
}

// CallLog is the fake provider's call log (one line per process start and
// per method).
func (s *Stack) CallLog() string { return filepath.Join(s.opts.Dir, "fake-codex-calls.log") }

// LogPath is the log file of the named process.
func (s *Stack) LogPath(name string) string { return filepath.Join(s.opts.Dir, "logs", name+".log") }

// BlobDir is where the backup verifier stores checkpoint archives.
func (s *Stack) BlobDir() string { return filepath.Join(s.opts.Dir, "backup-blobs") }

// WorkspaceRoot is the stack's workspace root (the executors' and gateways'
// -workspace-root): a run's workspace.cwd lies in <root>/<company_id>.
func (s *Stack) WorkspaceRoot() string { return filepath.Join(s.opts.Dir, "workspaces") }

// RunnerStateRoot is where runnergw keeps runner state.
func (s *Stack) RunnerStateRoot() string { return filepath.Join(s.opts.Dir, "runners") }

// RunnerStateRootOf is where the named gateway keeps runner state.
func (s *Stack) RunnerStateRootOf(gateway string) string {
	if gateway == "runnergw" {
		return s.RunnerStateRoot()
	}
	return filepath.Join(s.opts.Dir, "runners-"+gateway)
}

// RegistrationSecretFile is the registration secret the stack's executors
// and gateways share (SPEC T5): gateways without a certificate prove it to
// register; whichever service starts first creates it (0600).
func (s *Stack) RegistrationSecretFile() string {
	return filepath.Join(s.opts.Dir, "keys", "registration.key")
}

// runnerAuthKeyFile is the named gateway's runner credential key.
func (s *Stack) runnerAuthKeyFile(gateway string) string {
	if gateway == "runnergw" {
		return filepath.Join(s.opts.Dir, "keys", "gateway.key")
	}
	return filepath.Join(s.opts.Dir, "keys", gateway+".key")
}

// GatewayIDOf is a gateway's id: GatewayID for the stack's first gateway,
// its name for the others.
func GatewayIDOf(name string) string {
	if name == "runnergw" {
		return GatewayID
	}
	return name
}

// Proc returns a started process.
func (s *Stack) Proc(name string) *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

func (s *Stack) args(name string) []string {
	metrics := ""
	if port := s.opts.MetricsPorts[name]; port != 0 {
		metrics = "127.0.0.1:" + strconv.Itoa(port)
	}
	common := []string{"-log-format", "json", "-metrics-addr", metrics}
	var migrate []string
	if s.opts.Migrated {
		migrate = []string{"-migrate=false"}
	}
	s.mu.Lock()
	extra := s.extra[name]
	s.mu.Unlock()
	switch {
	case name == "executor" || strings.HasPrefix(name, "executor-"):
		a := append(append(common, "-grpc-addr", s.Addr(name), "-database-url", s.opts.DatabaseURL,
			"-gateway-addr", s.Addr("runnergw"), "-lease-ttl", s.opts.LeaseTTL.String(), "-poll-interval", "250ms",
			"-owner-id", name, "-grant-key-file", s.GrantKeyFile(), "-gateway-id", GatewayID,
			"-checkpoint-after", s.opts.CheckpointAfter.String(), "-workspace-root", s.WorkspaceRoot(),
			"-registration-secret-file", s.RegistrationSecretFile(), "-secrets-key-file", s.SecretsKeyFile(),
			"-backup-addr", s.Addr("backup-verifier")), migrate...)
		if s.opts.Auth {
			a = append(a, "-auth-jwks", s.JWKSFile())
		}
		if s.opts.HTTP && name == "executor" {
			a = append(a, "-http-addr", s.HTTPAddr())
		}
		a = append(a, s.opts.ExecutorArgs...)
		a = append(a, s.tlsArgs(identity.Executor, "-gateway-ca", "-backup-ca")...)
		return append(a, extra...)
	case name == "runnergw" || strings.HasPrefix(name, "runnergw-"):
		runnerPort := s.opts.RunnerPort
		if name != "runnergw" {
			s.mu.Lock()
			runnerPort = s.ports[name+"/runner"]
			s.mu.Unlock()
		}
		a := append(common, "-grpc-addr", s.Addr(name),
			"-runner-addr", "127.0.0.1:"+strconv.Itoa(runnerPort),
			"-state-root", s.RunnerStateRootOf(name), "-workspace-root", s.WorkspaceRoot(),
			"-registration-secret-file", s.RegistrationSecretFile(),
			"-runner-auth-key-file", s.runnerAuthKeyFile(name),
			"-grant-public-keys", s.GrantPublicKeyFile(), "-gateway-id", GatewayIDOf(name),
			"-runnerd-path", filepath.Join(s.opts.BinDir, "runnerd"),
			"-backup-addr", s.Addr("backup-verifier"))
		codexArgs := []string{"--state-file-in-codex-home", "--durable-turn-ids"}
		if !s.opts.NoCallLog {
			codexArgs = append(codexArgs, "--record-process-start", "--call-log", s.CallLog())
		}
		codexArgs = append(codexArgs, s.opts.FakeArgs...)
		codex := filepath.Join(s.opts.BinDir, "fake-codex-app-server")
		if s.opts.CodexCommand != "" {
			codex, codexArgs = s.opts.CodexCommand, s.opts.CodexArgs
		}
		a = append(a, "-codex-command", codex)
		for _, f := range codexArgs {
			a = append(a, "-codex-arg", f)
		}
		a = append(a, s.tlsArgs(identity.Gateway, "-backup-ca")...)
		return append(append(a, s.opts.GatewayArgs...), extra...)
	case name == "backup-verifier":
		// The verifier keeps its metadata in its own schema (backup) of
		// the stack's database, and its archives in the stack's directory.
		a := append(common, "-grpc-addr", s.Addr("backup-verifier"),
			"-database-url", s.opts.DatabaseURL,
			"-blob-url", "file://"+s.BlobDir()+"?create_dir=true",
			"-staging-dir", filepath.Join(s.opts.Dir, "backup-staging"),
			"-stamp-key-file", filepath.Join(s.opts.Dir, "keys", "stamp.key"))
		a = append(append(a, migrate...), s.tlsArgs(identity.BackupVerifier)...)
		return append(a, extra...)
	}
	return nil
}

// Start launches a service and waits until its gRPC health says SERVING.
func (s *Stack) Start(ctx context.Context, name string) (*Proc, error) {
	logf, err := os.OpenFile(filepath.Join(s.opts.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	bin := name
	switch {
	case strings.HasPrefix(name, "executor-"):
		bin = "executor"
	case strings.HasPrefix(name, "runnergw-"):
		bin = "runnergw"
	}
	path, args := filepath.Join(s.opts.BinDir, bin), s.args(name)
	s.mu.Lock()
	other, ok := s.binaries[name]
	s.mu.Unlock()
	if ok {
		path = other
		if args, err = knownFlags(path, args); err != nil {
			logf.Close()
			return nil, err
		}
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(append(os.Environ(), "TETHER_DATABASE_URL="), s.opts.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group (procgroup.Start), and die with us if we die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	s.mu.Lock()
	ownNS := s.pidNS[name]
	s.mu.Unlock()
	if ownNS {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
		if uid, gid := os.Geteuid(), os.Getegid(); uid != 0 {
			cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
			cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}}
			cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}}
		}
	}
	if err := procgroup.Start(cmd); err != nil {
		logf.Close()
		return nil, err
	}
	p := &Proc{Name: name, Addr: s.Addr(name), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs[name] = p
	s.mu.Unlock()
	if err := s.waitServing(ctx, p); err != nil {
		p.Stop(time.Second)
		return nil, fmt.Errorf("%s did not become healthy (log: %s): %w", name, filepath.Join(s.opts.Dir, "logs", name+".log"), err)
	}
	return p, nil
}

// StartAll launches backup-verifier, runnergw and executor.
func (s *Stack) StartAll(ctx context.Context) error {
	for _, n := range []string{"backup-verifier", "runnergw", "executor"} {
		if _, err := s.Start(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// waitServing polls the process's gRPC health until SERVING.
func (s *Stack) waitServing(ctx context.Context, p *Proc) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The process listens a moment after it starts: retry the connection
	// every few tens of milliseconds, not after gRPC's default backoff (1 s,
	// growing), which made every start take a second or more.
	conn, err := s.DialAs(p.Addr, identity.Client, grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
		MinConnectTimeout: 5 * time.Second,
	}))
	if err != nil {
		return err
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	for {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		resp, err := h.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		ccancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-p.done:
			return errors.New("process exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops every process: executors first, then the gateway (which stops
// its runners), then the verifier.
func (s *Stack) Stop() {
	s.mu.Lock()
	executors, gateways := []string{"executor"}, []string{}
	for n := range s.ports {
		switch {
		case strings.HasPrefix(n, "executor-"):
			executors = append(executors, n)
		case strings.HasPrefix(n, "runnergw-") && !strings.HasSuffix(n, "/runner"):
			gateways = append(gateways, n)
		}
	}
	s.mu.Unlock()
	for _, n := range append(append(executors, gateways...), "runnergw", "backup-verifier") {
		if p := s.Proc(n); p != nil {
			select {
			case <-p.done:
			default:
				p.Stop(10 * time.Second)
			}
		}
	}
}

// Kill ends the stack at once, as a power cut would: SIGKILL to every
// process of the stack — its services and what they launched (runnerd,
// providers), found by the stack's directory (KillProcessesUnder) — and
// waits for its services. Tests tear their stacks down so: a graceful
// Stop waits for every runnerd to drain its outbox to a gateway that no
// longer acknowledges (2 s each).
func (s *Stack) Kill() {
	s.mu.Lock()
	procs := slices.Collect(maps.Values(s.procs))
	s.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	KillProcessesUnder(s.opts.Dir)
	for _, p := range procs {
		<-p.done
	}
}

// KillProcessesUnder sends SIGKILL to every process but this one whose
// command line, environment or working directory names the directory root
// (or a path below it), and returns how many it signalled. A pidfd pins
// each process before the check, so that a pid reused meanwhile (the pid
// space is shared with every other test of the machine) is never
// signalled.
func KillProcessesUnder(root string) int {
	root = filepath.Clean(root) + "/"
	under := func(pid int) bool {
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		environ, _ := os.ReadFile(filepath.Join(dir, "environ"))
		cwd, _ := os.Readlink(filepath.Join(dir, "cwd"))
		return strings.Contains(string(cmdline), root) || strings.Contains(string(environ), root) || strings.HasPrefix(cwd+"/", root)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if killMatching(pid, under) {
			killed++
		}
	}
	return killed
}

// killMatching sends SIGKILL to pid if it still is a process that matches.
func killMatching(pid int, matches func(int) bool) bool {
	const sysPidfdOpen, sysPidfdSendSignal = 434, 424
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return false // gone already
	}
	defer syscall.Close(int(fd))
	if !matches(pid) {
		return false
	}
	_, _, errno = syscall.Syscall6(sysPidfdSendSignal, fd, uintptr(syscall.SIGKILL), 0, 0, 0, 0)
	return errno == 0
}
