package gateway

import (
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/procgroup"
	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/pkg/synctrace"

	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/telemetry"
)

// ContractVersion is the runnerd binary contract this gateway speaks (G2).
const ContractVersion = 2

// BuildMetadataSchema names runnerd's build metadata document.
const BuildMetadataSchema = "tether/runnerd-build-metadata/v1"

type buildMetadataJSON struct {
	Schema                string   `json:"schema"`
	BinaryName            string   `json:"binaryName"`
	PackageName           string   `json:"packageName"`
	PackageVersion        string   `json:"packageVersion"`
	BinaryContractVersion uint32   `json:"binaryContractVersion"`
	PrpTransportModes     []string `json:"prpTransportModes"`
}

// ReadBuildMetadata runs `runnerd --build-metadata` and checks the contract
// for the transport mode the gateway needs (G2): a stale contract is
// runner_remote_artifact_contract_incompatible, a missing mode is
// runner_remote_transport_capability_missing:<mode>; there is no fall-through
// to another mode.
func ReadBuildMetadata(ctx context.Context, runnerdPath, mode string) (*gatewayv1.BuildMetadata, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, runnerdPath, "--build-metadata").Output()
	if err != nil {
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteArtifactContractIncompatible,
			"%s --build-metadata failed: %v", runnerdPath, err)
	}
	return CheckBuildMetadata(out, mode)
}

// CheckBuildMetadata validates a build metadata document.
func CheckBuildMetadata(doc []byte, mode string) (*gatewayv1.BuildMetadata, error) {
	var m buildMetadataJSON
	if err := json.Unmarshal(bytes.TrimSpace(doc), &m); err != nil || m.Schema != BuildMetadataSchema {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteArtifactContractIncompatible,
			"runner build metadata is not a %s document", BuildMetadataSchema)
	}
	if m.BinaryContractVersion != ContractVersion {
		return nil, failure.New(codes.FailedPrecondition, failure.RunnerRemoteArtifactContractIncompatible,
			"runner binary contract version %d, gateway needs %d", m.BinaryContractVersion, ContractVersion)
	}
	if !slices.Contains(m.PrpTransportModes, mode) {
		return nil, failure.New(codes.FailedPrecondition, failure.Qualified(failure.RunnerRemoteTransportCapabilityMissing, mode),
			"runner build supports %v", m.PrpTransportModes)
	}
	return &gatewayv1.BuildMetadata{
		Schema: m.Schema, BinaryName: m.BinaryName, PackageName: m.PackageName, PackageVersion: m.PackageVersion,
		BinaryContractVersion: m.BinaryContractVersion, PrpTransportModes: m.PrpTransportModes,
	}, nil
}

// launched is a runnerd child process.
type launched struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func randomID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// persistedIdentity reads the runner instance id and process a previous
// runnerd left in its state dir, if any.
func persistedIdentity(stateDir string) (instanceID string, proc *prpv1.ProcessInfo) {
	st, err := readRunnerState(stateDir)
	if err != nil || st == nil {
		return "", nil
	}
	return st.Identity.RunnerInstanceID, runnerProcess(st)
}

// processAlive reports whether pid is alive and is the same process (same
// start time), so PID reuse cannot fool it.
func processAlive(p *prpv1.ProcessInfo) bool {
	if p.GetStartTicks() == 0 {
		return procid.Exists(int(p.GetPid()))
	}
	return procid.Alive(int(p.GetPid()), p.GetStartTicks(), "")
}

// launchSpec is what a runnerd launch needs.
type launchSpec struct {
	stateDir, workspace, instanceID, leaseID, sessionID, scope string
	// company owns the runner: its uid, when runners run under their
	// company's uid (SPEC T7).
	company string
	ticket  prp.Credential
	mode    string
	// listenURL is set by launch for listen_ws: where the gateway dials.
	listenURL string
	// provider is the verified launch profile of a pinned provider; nil
	// launches codex (-codex-command).
	provider *providerlaunch.Profile
	// kind is the run's provider kind (its persistence profile names the
	// provider home runnerd needs).
	kind string
}

// runnerSubtrees are the entries of a scope root that runnerd and its
// provider own (SPEC T7): handed over to the company's uid in the UID
// modes; everything else in the root stays the gateway's.
var runnerSubtrees = append([]string{durable.RunnerDir, providerTemplateDir}, providerHomes...)

// neededSubtrees are the runner's subtrees a launch creates (the scope
// root is not the runner's to create them in): its state, codex's home
// (runnerd keeps one whatever the provider) and its provider's home.
func (spec *launchSpec) neededSubtrees() []string {
	need := []string{durable.RunnerDir, durable.CodexHomeDir}
	if p, ok := persistenceOf(spec.kind); ok && p.home != durable.CodexHomeDir {
		need = append(need, p.home)
	}
	return need
}

// launchProfile returns the verified launch profile of the input's
// provider: nil for codex, else its pinned profile (refused when
// unconfigured, unpinned or mismatching; see providerlaunch).
func (g *Gateway) launchProfile(in *prpv1.ExecutionInput) (*providerlaunch.Profile, error) {
	if providerlaunch.Name(in.GetProvider()) == providerlaunch.Codex {
		return nil, nil
	}
	p, err := g.cfg.Providers.For(in.GetProvider())
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// providerArgs are runnerd's provider flags: codex's command and
// arguments (the gateway's -codex-command/-codex-arg) as
// --provider-command/--provider-arg, or --provider NAME with the profile's
// command and arguments. Where providers are sandboxed (SPEC T7) the
// command runnerd starts is the sandbox, the provider command inside it.
func (g *Gateway) providerArgs(spec *launchSpec) ([]string, error) {
	p := spec.provider
	if p == nil {
		cmd, cargs, err := g.cfg.Confine.Provider(spec.stateDir, spec.workspace, g.cfg.CodexCommand, g.cfg.CodexArgs)
		if err != nil {
			return nil, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerLocalConnectFailed, "confining the provider: %v", err)
		}
		args := []string{"--provider-command", cmd}
		for _, a := range cargs {
			args = append(args, "--provider-arg", a)
		}
		return args, nil
	}
	cmd, cargs, err := g.cfg.Confine.Provider(spec.stateDir, spec.workspace, p.Command, p.Args)
	if err != nil {
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerLocalConnectFailed, "confining the provider: %v", err)
	}
	args := []string{"--provider", p.Name, "--provider-command", cmd}
	for _, a := range cargs {
		args = append(args, "--provider-arg", a)
	}
	tmpl, err := g.companyTemplate(spec.company, p.Name, p.HomeTemplate)
	if err != nil {
		return nil, err
	}
	if tmpl != "" && g.cfg.ProviderHomeTemplates != "" {
		// The company's own (or _default) template: copied into the scope
		// root, where runnerd (under the company's uid, SPEC T7) reads it.
		if tmpl, err = materializeProviderTemplate(tmpl, spec.stateDir); err != nil {
			return nil, err
		}
	}
	if tmpl != "" {
		args = append(args, "--provider-home-template", tmpl)
	}
	return args, nil
}

// transportArgs are runnerd's flags for the spec's transport mode.
func (g *Gateway) transportArgs(spec *launchSpec) ([]string, error) {
	switch spec.mode {
	case prp.ModeDialWSS:
		args := []string{"--connect-url", g.cfg.PublicURL}
		if g.cfg.CABundle != "" {
			args = append(args, "--ca-bundle-path", g.cfg.CABundle)
		}
		return args, nil
	case prp.ModeListenWS:
		port, err := freePort(g.cfg.IngressHost)
		if err != nil {
			return nil, failure.Wrap(err, codes.Unavailable, failure.RunnerIngressUnavailable, "no free port on %s: %v", g.cfg.IngressHost, err)
		}
		path := "/v1/runners/connect/" + spec.instanceID
		args := []string{"--listen-address", g.cfg.IngressHost, "--listen-port", strconv.Itoa(port), "--listen-path", path}
		scheme := "ws"
		if g.cfg.IngressCert != "" {
			args = append(args, "--listen-tls-cert", g.cfg.IngressCert, "--listen-tls-key", g.cfg.IngressKey)
			scheme = "wss"
		}
		spec.listenURL = scheme + "://" + net.JoinHostPort(g.cfg.IngressHost, strconv.Itoa(port)) + path
		return args, nil
	}
	return []string{"--connect-url", g.cfg.ConnectURL}, nil
}

func (g *Gateway) launch(spec *launchSpec) (*launched, error) {
	for _, d := range []string{spec.stateDir, spec.workspace} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, failure.Wrap(err, codes.Internal, failure.RunnerLocalConnectFailed, "creating %s: %v", d, err)
		}
	}
	if spec.provider == nil {
		tmpl, err := g.companyTemplate(spec.company, "", g.cfg.CodexHomeTemplate)
		if err != nil {
			return nil, err
		}
		if err := materializeCodexHome(tmpl, spec.stateDir, g.cfg.ProviderHomeTemplates != ""); err != nil {
			return nil, err
		}
	}
	args, err := g.transportArgs(spec)
	if err != nil {
		return nil, err
	}
	if err := writeLaunchRecord(spec.stateDir, launchRecord{Mode: spec.mode, ListenURL: spec.listenURL}); err != nil {
		return nil, scopeWriteError(err, "writing the launch record")
	}
	args = append(args,
		"--state-dir", spec.stateDir,
		"--runner-id", spec.instanceID,
		"--environment-lease-id", spec.leaseID,
		"--session-id", spec.sessionID,
		"--session-scope", spec.scope,
		"--workspace", spec.workspace,
		"--idle-timeout", g.cfg.IdleTimeout.String(),
		"--reconnect-grace", g.cfg.ReconnectGrace.String(),
		// This gateway pings every PingInterval: silence for PingTimeout
		// means the connection is dead on runnerd's side too.
		"--gateway-silence-timeout", g.cfg.PingTimeout.String(),
	)
	if d := g.cfg.SemanticToolTimeout; d > 0 {
		args = append(args, "--semantic-tool-timeout", d.String())
	}
	pargs, err := g.providerArgs(spec)
	if err != nil {
		return nil, err
	}
	args = append(args, pargs...)
	if g.cfg.OTLPEndpoint != "" {
		args = append(args, "--otlp-endpoint", g.cfg.OTLPEndpoint)
	}
	logf, err := openScopeLog(spec.stateDir)
	if err != nil {
		return nil, scopeWriteError(err, "opening runnerd's log")
	}
	g.noteLaunch(filepath.Base(spec.stateDir), logf)
	// Last, once every file of the launch is written: the runner's
	// subtrees and workspace become the company's uid's, the scope root
	// and the rest stay the gateway's (SPEC T7).
	cred, err := g.cfg.Confine.Runner(spec.company, spec.stateDir, spec.workspace, runnerSubtrees, spec.neededSubtrees())
	if err != nil {
		logf.Close()
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerLocalConnectFailed, "confining the runner: %v", err)
	}
	ticket, err := ticketPipe(spec.ticket)
	if err != nil {
		logf.Close()
		return nil, failure.Wrap(err, codes.Internal, failure.RunnerLocalConnectFailed, "handing over the bootstrap ticket: %v", err)
	}
	defer ticket.Close()
	cmd := exec.Command(g.cfg.RunnerdPath, append(args, "--bootstrap-ticket-fd", strconv.Itoa(ticketFD))...)
	// An allow-listed environment without the ticket (SPEC S5): it comes
	// through an inherited pipe, so it never shows in /proc/<pid>/environ.
	// The OpenTelemetry settings (OTEL_*) pass too: runnerd exports its
	// spans where the gateway does (the provider never sees them).
	cmd.Env = append(append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + spec.stateDir}, telemetry.Environ()...), synctrace.Environ()...)
	cmd.ExtraFiles = []*os.File{ticket}
	cmd.Dir = spec.stateDir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: runnerd outlives a crashed gateway and is
	// adopted when the gateway comes back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := procgroup.Start(cmd); err != nil {
		logf.Close()
		return nil, failure.Wrap(err, codes.Unavailable, failure.RunnerLocalConnectFailed, "starting runnerd: %v", err)
	}
	l := &launched{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(l.done)
	}()
	return l, nil
}

// exited reports whether the launched process has ended.
func (l *launched) exited() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// ticketFD is the descriptor runnerd reads its bootstrap ticket from: the
// first of cmd.ExtraFiles.
const ticketFD = 3

// ticketPipe returns the read end of a pipe that holds the encoded ticket
// and then ends (the write end is closed): runnerd reads it to EOF once
// and closes it. A ticket is far smaller than a pipe's buffer, so the
// write never waits for the reader.
func ticketPipe(c prp.Credential) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, werr := w.WriteString(c.Encode())
	if err := errors.Join(werr, w.Close()); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// stop terminates a runnerd process group: TERM, grace, KILL. A process
// known gone (done closed: reaped, or no longer the recorded process) gets
// no signal. runnerd's children (provider host, shim, provider) live in
// groups of their own, so nothing is left in its group; its id is free,
// and a process started since (another scope's runnerd, which leads a
// group of its own, on a box that wraps pid_max within minutes) may lead a
// group of that id.
func stopGroup(pid int, done <-chan struct{}, grace time.Duration) {
	if pid <= 0 {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	if procgroup.Stop(context.Background(), pid, done, grace) {
		select {
		case <-done:
		case <-time.After(grace):
		}
	}
}

// pollExit returns a channel closed when the (non-child) process is gone.
func pollExit(p *prpv1.ProcessInfo) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 600 && processAlive(p); i++ {
			time.Sleep(10 * time.Millisecond)
		}
	}()
	return done
}

// stopOrphanProviderHost stops the provider host recorded in a runnerd
// state dir when it still runs (same pid and start time) although its
// runnerd is gone. The host stops its provider (stdin EOF, TERM, KILL).
func stopOrphanProviderHost(stateDir string) {
	raw, err := os.ReadFile(filepath.Join(stateDir, "runner", "provider-host.json"))
	if err != nil {
		return
	}
	var in struct {
		HostPID        int32  `json:"hostPid"`
		HostStartTicks uint64 `json:"hostStartTicks"`
	}
	if json.Unmarshal(raw, &in) != nil || in.HostStartTicks == 0 {
		return
	}
	p := &prpv1.ProcessInfo{Pid: in.HostPID, StartTicks: in.HostStartTicks}
	if !processAlive(p) || !sameOwner(filepath.Join(stateDir, durable.RunnerDir), int(in.HostPID)) {
		return
	}
	_ = syscall.Kill(int(in.HostPID), syscall.SIGTERM)
	<-pollExit(p)
}

// sameOwner reports whether process pid runs as the owner of dir (the
// scope's runner/). A runner under its company's uid (SPEC T7) can write
// any file of its subtree, provider-host.json too: the gateway signals only
// a process of that uid, never one of its own or another company's.
func sameOwner(dir string, pid int) bool {
	var root, proc syscall.Stat_t
	if syscall.Lstat(dir, &root) != nil || syscall.Stat("/proc/"+strconv.Itoa(pid), &proc) != nil {
		return false
	}
	return root.Uid == proc.Uid
}

// templateFiles are the launch-only provider home files a template supplies.
var templateFiles = []string{"auth.json", "config.toml"}

// CheckCodexHomeTemplate validates a provider home template at startup: a
// real directory whose files are private credential files by the key-file
// rule (SPEC S3, pkg/keyfile: a regular file, not a symlink, owned by the
// gateway's user, mode 0600 or stricter).
func CheckCodexHomeTemplate(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("codex home template %s is not a directory", dir)
	}
	for _, name := range templateFiles {
		err := keyfile.Check(filepath.Join(dir, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("codex home template: %w", err)
		}
	}
	return nil
}
