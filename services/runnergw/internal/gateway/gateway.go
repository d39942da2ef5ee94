// Package gateway relays between executors (gRPC Attach streams) and runners
// (PRP over WebSocket). It holds live connections only: a restarted gateway
// re-learns everything from runners' hellos and executors' re-attaches.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grant"
	"github.com/tether-run/tether/pkg/providerlaunch"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/scope"
	"github.com/tether-run/tether/pkg/scope/durable"
	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/pkg/telemetry"
	"github.com/tether-run/tether/pkg/workspace"
	"github.com/tether-run/tether/services/runnergw/internal/confine"
)

// ReasonAuthorityRotated is logged when a run takes over a live warm
// runner from an earlier run (SPEC E10).
const ReasonAuthorityRotated = "warm native session authority epoch rotated"

// ConnectPath is the WebSocket path runners dial.
const ConnectPath = "/v1/runners/connect"

// Config configures a Gateway.
type Config struct {
	// StateRoot is the durable state base: one root per session scope,
	// named by the scope's sha256 (SPEC E13), holding control-plane/ (the
	// run authority), runner/ and codex-home/ (runnerd's --state-dir is the
	// root), runnerd.log and the default workspace; quarantined roots go to
	// quarantine/.
	StateRoot string
	// WorkspaceRoot confines a run's workspace.cwd to
	// <WorkspaceRoot>/<company_id>, resolved (SPEC T6); "" is
	// workspace.DefaultRoot.
	WorkspaceRoot string
	// ConnectURL is the ws:// URL launched dial_ws_loopback runners dial
	// (loopback only).
	ConnectURL string
	// PublicURL is the wss:// URL launched dial_wss runners dial (the
	// gateway's TLS runner listener); empty: dial_wss is unavailable.
	PublicURL string
	// CABundle, when set, is handed to dial_wss runners (--ca-bundle-path)
	// so they trust a privately issued gateway certificate.
	CABundle string
	// Ingress admits companies to sandbox ingress (listen_ws); see
	// IngressPolicy.
	Ingress IngressPolicy
	// IngressHost is the address launched listen_ws runners listen on and
	// the gateway dials (default 127.0.0.1).
	IngressHost string
	// IngressCert and IngressKey, when set, are handed to listen_ws
	// runners so their listener serves TLS; the gateway then dials wss://
	// and verifies them with IngressTLS (nil: the system roots).
	IngressCert, IngressKey string
	IngressTLS              *tls.Config
	// PingInterval is how often the gateway pings each runner connection;
	// a connection without a pong for PingTimeout is closed.
	PingInterval, PingTimeout time.Duration
	// SemanticToolTimeout is passed to launched runners
	// (--semantic-tool-timeout); zero keeps runnerd's default.
	SemanticToolTimeout time.Duration
	// OTLPEndpoint is passed to launched runners (--otlp-endpoint), with
	// the gateway's OTEL_* environment, so their spans are exported where
	// the gateway's are.
	OTLPEndpoint string
	// RunnerdPath is the runnerd binary.
	RunnerdPath string
	// CodexCommand and CodexArgs launch the provider (the real codex
	// app-server or the fake).
	CodexCommand string
	CodexArgs    []string
	// Providers are the pinned launch profiles of the other providers
	// (OpenCode, ACPX agents); a run whose provider has none, or whose
	// pins do not match, is refused before anything is launched.
	Providers providerlaunch.Set
	// CodexHomeTemplate, when set, is a directory whose launch-only provider
	// home files (auth.json, config.toml) are copied into a scope's
	// codex-home before each runner launch — fresh, resumed or restored —
	// since they never travel in a backup. See CheckCodexHomeTemplate.
	CodexHomeTemplate string
	// ProviderHomeTemplates, when set, holds a provider home template per
	// company (<dir>/<company_id>/, <dir>/_default/); CodexHomeTemplate and
	// the profiles' templates are then only the shared fallback. See
	// templates.go.
	ProviderHomeTemplates string
	// IdleTimeout is how long a warm runner lives without work.
	IdleTimeout time.Duration
	// ReconnectGrace is how long a runner keeps trying to reconnect.
	ReconnectGrace time.Duration
	// ConnectTimeout bounds how long an Attach waits for its runner.
	ConnectTimeout time.Duration
	// Build is the checked runnerd build metadata.
	Build     *gatewayv1.BuildMetadata
	Authority *prp.Authority
	// Grants verifies the executor fleet's grant on every RunnerGateway
	// call (SPEC S1); nil refuses every call.
	Grants *grant.Verifier
	// Backup is the backup verifier: suspensions upload their checkpoints
	// to it, restores verify stamps with it and download from it. Nil:
	// SuspendRunner and restore specs fail with
	// runner_harness_backup_unavailable.
	Backup backupv1.BackupVerifierClient
	Logger *slog.Logger
	// Metrics registers the gateway's domain counters (nil: not exported).
	Metrics prometheus.Registerer
	// Confine confines launched runners and providers (SPEC T7); nil
	// confines nothing.
	Confine *confine.Confiner
	// Draining, when closed, ends Attach streams with Unavailable so a
	// graceful shutdown is not held up; executors re-attach elsewhere.
	Draining <-chan struct{}
	// RunnerLogMaxBytes bounds a scope's runnerd.log before it is rotated
	// (runnerlogs.go); 0: 8 MiB.
	RunnerLogMaxBytes int64
}

// Gateway is the relay.
type Gateway struct {
	cfg Config
	log *slog.Logger

	// epochs are the tool authority epochs per session scope.
	epochs  durable.Epochs
	metrics *metrics

	mu      sync.Mutex
	runners map[string]*runner // by session scope
	highest map[string]uint64  // highest attempt seen per run
	// highestOrder orders highest's runs, oldest first (bounded).
	highestOrder []string
	// ended are runs an executor attested ended (endRuns), endedOrder
	// orders them, oldest first (bounded); spent are the grants used.
	ended      map[string]bool
	endedOrder []string
	spent      *grant.Ledger
	closed     bool
	// markers numbers the Replay markers (prpv1.Replay.marker).
	markers atomic.Uint64
	// logStarts are where the runnerd logs of the scopes launched since
	// the last poll began (runnerlogs.go); under mu.
	logStarts map[string]int64

	// ctx ends at Close: it bounds the connections the gateway dials
	// (listen_ws) and their dial loops.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns a Gateway.
func New(cfg Config) *Gateway {
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = 10 * time.Minute
	}
	if cfg.ReconnectGrace == 0 {
		cfg.ReconnectGrace = 2 * time.Minute
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 20 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.IngressHost == "" {
		cfg.IngressHost = "127.0.0.1"
	}
	if cfg.RunnerLogMaxBytes <= 0 {
		cfg.RunnerLogMaxBytes = maxRunnerLogBytes
	}
	if cfg.PingInterval == 0 {
		cfg.PingInterval = 10 * time.Second
	}
	if cfg.PingTimeout == 0 {
		cfg.PingTimeout = 3 * cfg.PingInterval
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gateway{cfg: cfg, log: cfg.Logger, runners: map[string]*runner{}, highest: map[string]uint64{}, ctx: ctx, cancel: cancel,
		metrics: newMetrics(cfg.Metrics), ended: map[string]bool{}, spent: grant.NewLedger(nil)}
	if cfg.Metrics != nil {
		_ = cfg.Metrics.Register(sessionGauges{g})
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.followRunnerLogs(ctx)
	}()
	return g
}

// runner is one runnerd (one session scope).
type runner struct {
	scope string
	// ops (capacity 1) serialises what changes the scope's runner as a
	// whole: a suspension, and an attach's restore and launch.
	ops chan struct{}

	mu          sync.Mutex
	instanceID  string
	conn        *prp.Conn
	connID      string
	connected   chan struct{} // closed while a connection is registered
	connectedAt time.Time
	hello       *prpv1.Hello
	// provider is the provider process the runner last reported (its
	// hello, then its pongs: it changes when the provider is restarted).
	provider   *prpv1.ProcessInfo
	gen        uint64 // connection generation of conn
	mode       string // transport of conn
	lastPong   time.Time
	lastCmdSeq uint64
	ackedSeq   uint64
	// bound and attachSent keep the scope's binding in memory (see
	// boundRun) between warm attaches.
	bound      *boundRun
	attachSent uint64
	diskBinds  int // bindings read from disk (tests)
	// online is the checkpoint this gateway last took online from the
	// live runner of connection generation online.gen (SPEC P6); see
	// supersededLive. rootScans counts its reads of the root's produced
	// state (tests).
	online    onlineCheckpoint
	rootScans int
	att       *attachment
	child     *launched
	lifecycle string
	// dialURL is the listener a listen_ws dial loop is dialling (empty:
	// none); dialGen identifies the current loop.
	dialURL string
	dialGen uint64
}

type attachment struct {
	runID   string
	attempt uint64
	// input is the run's input, from the attach's Open: the run.attach
	// relayed to the runner is completed with it (completeAttach).
	input *prpv1.ExecutionInput
	// turn is the one turn.start the attach may relay (unauthorizedTurn).
	turn string
	// tools is the scope's tool authority epoch begun for this attachment.
	tools *durable.ToolAuthority
	out   chan *gatewayv1.AttachResponse
	done  chan struct{}
	once  sync.Once
	// gate is the marker of the Replay sent for this attachment while the
	// runner has not answered it (0: open). Event frames before the
	// marker's Pong are not relayed: the runner sent them before it read the
	// Replay, so the replay that follows the Pong carries them again, and
	// relaying them first would hand the executor later events before
	// earlier ones (SPEC G4: relayed in order).
	gate atomic.Uint64
}

func (a *attachment) close() { a.once.Do(func() { close(a.done) }) }

// deliver hands a response to the attached executor, blocking (backpressure
// on the runner connection) until it is taken or the attachment ends.
func (a *attachment) deliver(ctx context.Context, r *gatewayv1.AttachResponse) {
	select {
	case a.out <- r:
	case <-a.done:
	case <-ctx.Done():
	}
}

func (g *Gateway) runnerFor(sc string) *runner {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.runners[sc]
	if r == nil {
		r = &runner{scope: sc, connected: make(chan struct{}), ops: make(chan struct{}, 1)}
		g.runners[sc] = r
	}
	return r
}

// fence records attempt for run and refuses one lower than the highest seen.
func (g *Gateway) fence(runID string, attempt uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h := g.highest[runID]; attempt < h {
		return failure.New(codes.FailedPrecondition, failure.RunnerAttemptFenced,
			"attempt %d of run %s is below the highest attempt %d seen", attempt, runID, h)
	}
	if _, ok := g.highest[runID]; !ok {
		g.highestOrder = append(g.highestOrder, runID)
		for len(g.highestOrder) > maxFencedRuns {
			delete(g.highest, g.highestOrder[0])
			g.highestOrder = g.highestOrder[1:]
		}
	}
	g.highest[runID] = attempt
	return nil
}

// maxFencedRuns bounds the runs whose highest attempt the gateway keeps in
// memory (the most recently first-seen ones); an older run's stale attempt
// is still refused by the runner and by the executor's lease.
const maxFencedRuns = 4096

// confineWorkspace refuses (workspace_outside_root) a run whose
// workspace.cwd is not, once resolved, inside its company's workspace root,
// and creates it; an empty cwd is the scope's own workspace directory.
func (g *Gateway) confineWorkspace(in *prpv1.ExecutionInput) error {
	cwd := in.GetWorkspace().GetCwd()
	if cwd == "" {
		return nil
	}
	root := g.cfg.WorkspaceRoot
	if root == "" {
		root = workspace.DefaultRoot
	}
	_, err := workspace.Confine(root, in.GetBinding().GetCompanyId(), cwd)
	return err
}

// stateDir is the scope's durable root: runnerd's --state-dir.
func (g *Gateway) stateDir(sc string) string { return filepath.Join(g.cfg.StateRoot, sc) }

// ensureRunner returns the live runner of the scope, adopting one that is
// still running from an earlier gateway or launching a new runnerd. A launch
// for a run (runID set) goes through the E13 authority first: the scope's
// durable root must be this run's, or a verified prior run's (prior are the
// executor's records), else nothing is launched. A launch without a run (a
// suspension waking a stopped runner on its own state) resumes the identity
// the state names. prep is the authority's answer for a launch, nil
// otherwise.
func (g *Gateway) ensureRunner(ctx context.Context, sc string, in *prpv1.ExecutionInput, mode, runID string, prior []*gatewayv1.PriorRun) (_ *runner, reused bool, prep *durable.Prepared, _ error) {
	r := g.runnerFor(sc)
	r.mu.Lock()
	if r.conn != nil {
		r.mu.Unlock()
		return r, true, nil, nil
	}
	wait := r.connected
	if c := r.child; c != nil {
		select {
		case <-c.done: // exited; its watcher has not caught up yet
			r.child = nil
		default:
		}
	}
	if r.child == nil {
		dir := g.stateDir(sc)
		inst, proc := persistedIdentity(dir)
		if !processAlive(proc) {
			var err error
			if prep, err = g.launchRunner(ctx, r, sc, dir, inst, in, mode, runID, prior); err != nil {
				r.mu.Unlock()
				return nil, false, nil, err
			}
		} else {
			g.log.Info("waiting for a live runner to reconnect", "runner_instance_id", inst, "pid", proc.GetPid())
			if rec := readLaunchRecord(dir); rec.Mode == prp.ModeListenWS && rec.ListenURL != "" {
				// A listening runner adopted from an earlier gateway: only
				// the gateway can re-establish its connection.
				g.startDialLoop(r, rec.ListenURL, false, func() bool { return processAlive(proc) })
			}
		}
	}
	r.mu.Unlock()
	t := time.NewTimer(g.cfg.ConnectTimeout)
	defer t.Stop()
	select {
	case <-wait:
		return r, false, prep, nil
	case <-t.C:
		return nil, false, nil, failure.New(codes.Unavailable, failure.RunnerLocalConnectFailed,
			"no runner connected for session scope %s within %s", sc, g.cfg.ConnectTimeout)
	case <-ctx.Done():
		return nil, false, nil, failure.ToStatus(ctx.Err())
	}
}

// launchRunner launches the scope's runner (r.mu held) when no live one
// is there: its launch profile and workspace are checked, a launch for a
// run goes through the E13 authority (prep is its answer), and a listening
// runner gets the gateway's dial loop.
func (g *Gateway) launchRunner(ctx context.Context, r *runner, sc, dir, inst string, in *prpv1.ExecutionInput, mode, runID string, prior []*gatewayv1.PriorRun) (prep *durable.Prepared, _ error) {
	prof, err := g.launchProfile(in)
	if err == nil {
		err = g.confineWorkspace(in)
	}
	if err != nil {
		return nil, err
	}
	spec := launchSpec{stateDir: dir, instanceID: inst, mode: mode, leaseID: LeaseFor(sc),
		sessionID: in.GetSession().GetNormalizedSessionId(), scope: sc, workspace: in.GetWorkspace().GetCwd(),
		provider: prof, company: in.GetBinding().GetCompanyId(), kind: in.GetProvider().GetKind()}
	if runID != "" {
		plan, p, err := g.launchAuthority(ctx, sc, runID, in, prior)
		if err != nil {
			return nil, err
		}
		prep = p
		spec.instanceID, spec.leaseID = plan.Identity.RunnerInstanceID, plan.Identity.EnvironmentLeaseID
		spec.sessionID, spec.workspace = plan.Identity.NormalizedSessionID, plan.WorkspaceCwd
	}
	if spec.instanceID == "" {
		spec.instanceID = randomID("runner-")
	}
	if spec.workspace == "" {
		spec.workspace = filepath.Join(dir, "workspace")
	}
	ticket, err := g.cfg.Authority.MintTicket(spec.instanceID, sc, g.cfg.ConnectTimeout+time.Minute)
	if err != nil {
		return nil, err
	}
	spec.ticket = ticket
	child, err := g.launch(&spec)
	if err != nil {
		return nil, err
	}
	inst = spec.instanceID
	r.child = child
	r.instanceID = inst
	go func() {
		<-child.done
		r.mu.Lock()
		if r.child == child {
			r.child = nil
		}
		r.mu.Unlock()
	}()
	g.log.Info("runner launched", "runner_instance_id", inst, "pid", child.cmd.Process.Pid, "session_scope", sc, "mode", mode)
	if mode == prp.ModeListenWS {
		g.startDialLoop(r, spec.listenURL, true, func() bool {
			select {
			case <-child.done:
				return false
			default:
				return true
			}
		})
	}
	return prep, nil
}

// endedRun reports whether the executor's prior-run records (read from the
// database when the Open was made) show runID terminal.
func endedRun(prior []*gatewayv1.PriorRun, runID string) bool {
	for _, p := range prior {
		if p.GetRunId() == runID {
			return p.GetTerminal()
		}
	}
	return false
}

// Attach serves one executor stream: the Open is authenticated and
// admitted, the scope's runner started or reused, the attachment bound to
// it, Opened sent, and then events and commands relayed.
func (g *Gateway) Attach(stream gatewayv1.RunnerGateway_AttachServer) error {
	ctx := stream.Context()
	claims, first, err := g.receiveOpen(ctx, stream)
	if err != nil {
		return err
	}
	endOpen := synctrace.Step("runnergw.open", first.GetOpen().GetRunId())
	defer func() { endOpen() }()
	open := first.GetOpen()
	mode, err := g.admitOpen(claims, open)
	if err != nil {
		return err
	}
	runID, attempt := open.GetRunId(), open.GetFence().GetAttempt()
	sc := scope.OfRun(runID, open.GetInput())
	log := g.log.With("run_id", runID, "attempt", attempt, "session_scope", sc)
	r, reused, prep, err := g.startRunner(ctx, sc, open, mode, log)
	if err != nil {
		return err
	}
	att := &attachment{runID: runID, attempt: attempt, turn: open.GetTurn(), input: open.GetInput(),
		out: make(chan *gatewayv1.AttachResponse, 64), done: make(chan struct{})}
	defer att.close()
	b, err := g.bindAttachment(r, att, sc, open, reused, prep, log)
	if err != nil {
		return err
	}
	defer func() {
		r.mu.Lock()
		if r.att == att {
			r.att = nil
		}
		r.mu.Unlock()
	}()
	if err := stream.Send(&gatewayv1.AttachResponse{Kind: &gatewayv1.AttachResponse_Opened{Opened: b.opened}}); err != nil {
		return err
	}
	endOpen()
	endOpen = func() {}
	if b.conn != nil {
		// Unacknowledged events may have been sent to an earlier attachment.
		_ = writeRunner(b.conn, &prpv1.Frame{Kind: &prpv1.Frame_Replay{Replay: &prpv1.Replay{AfterSourceSeq: b.after, Marker: b.marker}}})
	}
	log.Info("attached", "runner_instance_id", b.opened.GetRunnerInstanceId(), "reused", reused, "mode", mode)
	return g.relay(ctx, stream, r, att)
}

// receiveOpen checks the caller's grant before the Open is even read (an
// unproven caller leaves no trace, SPEC S1) and reads the first request.
func (g *Gateway) receiveOpen(ctx context.Context, stream gatewayv1.RunnerGateway_AttachServer) (*grant.Claims, *gatewayv1.AttachRequest, error) {
	endAuth := synctrace.Step("runnergw.authenticate", "")
	claims, err := g.authenticate(ctx, grant.MethodAttach)
	endAuth()
	if err != nil {
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	return claims, first, nil
}

// admitOpen matches the Open against the grant before the attempt is
// fenced or anything is looked at, refuses an ended run, ends the runs the
// executor reports ended, selects the transport, refuses a provider
// without a verified launch profile (before the attempt is fenced or any
// process starts) and fences the attempt. It returns the transport mode.
func (g *Gateway) admitOpen(claims *grant.Claims, open *gatewayv1.Open) (string, error) {
	if open == nil {
		return "", failure.New(codes.InvalidArgument, failure.AttachOpenRequired, "the first Attach request must be Open")
	}
	if err := g.match(claims, wantOpen(open)); err != nil {
		return "", err
	}
	if err := g.refuseEnded(open.GetRunId()); err != nil {
		return "", err
	}
	g.endRuns(open.GetPriorRuns(), open.GetRunId())
	mode, err := g.selectTransport(open)
	if err != nil {
		return "", err
	}
	if _, err := g.launchProfile(open.GetInput()); err != nil {
		return "", err
	}
	if err := g.fence(open.GetRunId(), open.GetFence().GetAttempt()); err != nil {
		return "", err
	}
	return mode, nil
}

// startRunner prepares the scope's continuity and starts (or reuses) its
// runner. A suspension of the scope in progress finishes first; the runner
// then comes back on its suspended state.
func (g *Gateway) startRunner(ctx context.Context, sc string, open *gatewayv1.Open, mode string, log *slog.Logger) (*runner, bool, *durable.Prepared, error) {
	runID := open.GetRunId()
	release, err := g.runnerFor(sc).acquireOp(ctx)
	if err != nil {
		return nil, false, nil, err
	}
	endCont := synctrace.Step("runnergw.continuity", runID)
	err = g.prepareContinuity(ctx, g.runnerFor(sc), sc, open, log)
	endCont()
	if err != nil {
		release()
		return nil, false, nil, err
	}
	endEnsure := synctrace.Step("runnergw.ensure_runner", runID)
	r, reused, prep, err := g.ensureRunner(ctx, sc, open.GetInput(), mode, runID, open.GetPriorRuns())
	endEnsure()
	release()
	if err != nil {
		log.Warn("runner not started", "code", failure.CodeOf(err), "err", err)
		return nil, false, nil, err
	}
	return r, reused, prep, nil
}

// boundAttachment is what bindAttachment hands back to Attach: the Opened
// to send, and the replay to ask the runner for (after, marker) on conn.
type boundAttachment struct {
	opened *gatewayv1.Opened
	conn   *prp.Conn
	after  uint64
	marker uint64
}

// bindAttachment makes att the runner's attachment, under the runner's
// lock: it refuses a scope serving another live run, supersedes a
// re-attach (or a stale attachment of an ended run), binds the run's
// authority and begins a new tool authority epoch.
func (g *Gateway) bindAttachment(r *runner, att *attachment, sc string, open *gatewayv1.Open, reused bool, prep *durable.Prepared, log *slog.Logger) (*boundAttachment, error) {
	runID := open.GetRunId()
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.att; old != nil {
		if old.runID != runID && !endedRun(open.GetPriorRuns(), old.runID) {
			return nil, failure.New(codes.Aborted, failure.NativeSessionSupervisorBusy,
				"session scope %s is serving run %s", sc, old.runID)
		}
		// A re-attach (or a newer attempt) of the same run supersedes; so
		// does the next run of the scope over a stale attachment of a run
		// the database shows ended (its controller stopped or lost its
		// lease before it detached): that attachment is refused from now on.
		if old.runID != runID {
			log.Info("a stale attachment of an ended run gives the scope up", "stale_run_id", old.runID, "stale_attempt", old.attempt)
		}
		old.close()
	}
	r.att = att
	opened := &gatewayv1.Opened{
		RunnerInstanceId: r.instanceID, Build: g.cfg.Build, Reused: reused,
		RunnerAckedSeq: r.ackedSeq, Lifecycle: r.lifecycle,
	}
	// This run now holds the scope's run authority: the control plane names
	// it, and a new tool authority epoch revokes the previous run's.
	endBind := synctrace.Step("runnergw.bind", runID)
	prev, err := g.bindRun(r, sc, runID, open.GetInput().GetSession().GetNormalizedSessionId(), r.instanceID, r.lastCmdSeq)
	endBind()
	if err != nil {
		r.att = nil
		return nil, err
	}
	if prep != nil {
		opened.DurableSource = string(prep.Source)
		if b := prep.Binding; b != nil && b.RunID != runID {
			prev = b.RunID
		}
	}
	opened.PreviousRunId = prev
	att.tools = g.epochs.Begin(sc, durable.ToolBinding{
		CompanyID: open.GetInput().GetBinding().GetCompanyId(), IssueID: open.GetInput().GetBinding().GetIssueId(),
		RunID: runID, AgentID: open.GetInput().GetBinding().GetAgentId(),
		NormalizedSessionID: open.GetInput().GetSession().GetNormalizedSessionId(),
	})
	opened.ToolAuthorityEpoch = att.tools.Epoch()
	if reused && prev != "" {
		g.metrics.rotations.Inc()
		log.Info(ReasonAuthorityRotated, "previous_run_id", prev, "tool_authority_epoch", opened.ToolAuthorityEpoch)
	}
	if r.hello != nil {
		opened.RunnerProcess = r.hello.GetRunnerProcess()
		opened.ProviderProcess = r.provider
	}
	b := &boundAttachment{opened: opened, conn: r.conn, after: r.ackedSeq}
	if b.conn != nil && prp.HasFeature(r.hello, prp.FeatureReplayMarker) {
		// Set before the attachment is visible to the connection's reader
		// without the lock.
		b.marker = 1<<63 | g.markers.Add(1)
		att.gate.Store(b.marker)
	}
	return b, nil
}

func (g *Gateway) fromExecutor(ctx context.Context, r *runner, att *attachment, req *gatewayv1.AttachRequest) error {
	switch k := req.GetKind().(type) {
	case *gatewayv1.AttachRequest_Command:
		cmd := k.Command
		cmd.RunId, cmd.Attempt = att.runID, att.attempt
		completeAttach(cmd, att.input)
		// The relay's span (a child of the Attach call's) travels with
		// the command, so runnerd's spans join the executor's trace.
		ctx, span := telemetry.StartCommand(ctx, "runnergw", cmd)
		defer span.End()
		cmd.TraceContext = telemetry.Inject(ctx)
		err := unauthorizedTurn(cmd, att.turn)
		if err == nil {
			err = revokedToolAuthority(cmd, att.tools)
		}
		if err != nil {
			// Refused here; the runner never sees it.
			att.deliver(ctx, &gatewayv1.AttachResponse{Kind: &gatewayv1.AttachResponse_CommandResult{CommandResult: &prpv1.CommandResult{
				CommandId: cmd.GetCommandId(), CommandType: cmd.GetType(), Status: "rejected",
				Code: string(failure.CodeOf(err)), Message: err.Error(), RunId: cmd.GetRunId(),
			}}})
			return nil
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.att != att {
			return failure.New(codes.Aborted, failure.RunnerAttachmentSuperseded, "attachment superseded")
		}
		if r.conn == nil {
			return failure.New(codes.Unavailable, failure.RunnerDisconnected, "the runner is reconnecting")
		}
		cmd.ControllerSeq = r.lastCmdSeq + 1
		if err := r.writeCommand(r.conn, cmd); err != nil {
			r.sentAttach(cmd) // it may have reached the runner
			return failure.Wrap(err, codes.Unavailable, failure.RunnerDisconnected, "sending %s: %v", cmd.GetType(), err)
		}
		r.sentAttach(cmd)
		r.lastCmdSeq = cmd.ControllerSeq
		return nil
	case *gatewayv1.AttachRequest_Ack:
		r.mu.Lock()
		defer r.mu.Unlock()
		n := k.Ack.GetPersistedThroughSeq()
		if n <= r.ackedSeq {
			return nil
		}
		r.ackedSeq = n
		if r.conn != nil {
			_ = writeRunner(r.conn, &prpv1.Frame{Kind: &prpv1.Frame_Ack{Ack: &prpv1.Ack{AckedSourceSeq: n}}})
		}
		return nil
	case *gatewayv1.AttachRequest_Open:
		return failure.New(codes.InvalidArgument, failure.AttachAlreadyOpen, "Open may only be the first request")
	}
	return nil
}

// completeAttach completes a run.attach the executor sent with the run's
// provider environment alone: the runner reads the run's input, the
// attach's Open input, with that environment (the policy applied, the
// secret values resolved) in place of the input's. The run input travels
// from the executor once. A run.attach that carries its input (an
// executor of the previous release) is relayed as it is.
func completeAttach(cmd *prpv1.Command, input *prpv1.ExecutionInput) {
	b := cmd.GetRunAttach()
	if b == nil || b.GetInput() != nil || input == nil {
		return
	}
	in := proto.CloneOf(input)
	in.Environment = b.GetEnvironment()
	cmd.Body = &prpv1.Command_RunAttach{RunAttach: &prpv1.RunAttach{Input: in}}
}

// runnerWriteTimeout bounds one write to a runner connection.
const runnerWriteTimeout = 10 * time.Second

// writeRunner writes to a runner connection under its own deadline. It must
// not use an executor stream's context: the WebSocket library closes the
// connection when a write's context ends mid-write, and an executor
// detaching (its stream ending) must never cut the runner off.
func writeRunner(c *prp.Conn, f *prpv1.Frame) error {
	ctx, cancel := context.WithTimeout(context.Background(), runnerWriteTimeout)
	defer cancel()
	return c.Write(ctx, f)
}

// writeCommand writes cmd to the runner's connection c (r.mu held), in
// the Struct payload form when the runner's build predates typed command
// bodies (its Hello lacks prp.FeatureTypedCommands).
func (r *runner) writeCommand(c *prp.Conn, cmd *prpv1.Command) error {
	if !prp.HasFeature(r.hello, prp.FeatureTypedCommands) {
		legacy, err := prp.Downgrade(cmd)
		if err != nil {
			return err
		}
		cmd = legacy
	}
	return writeRunner(c, &prpv1.Frame{Kind: &prpv1.Frame_Command{Command: cmd}})
}

// ServeHTTP accepts runner WebSocket connections at ConnectPath: over the
// plain loopback listener (dial_ws_loopback) or the TLS listener (dial_wss).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != ConnectPath {
		http.NotFound(w, req)
		return
	}
	ws, err := websocket.Accept(w, req, nil)
	if err != nil {
		return
	}
	mode := prp.ModeDialWSLoopback
	if req.TLS != nil {
		mode = prp.ModeDialWSS
	}
	g.serveRunner(req.Context(), prp.NewConn(ws), mode)
}

// serveRunner authenticates one runner connection (whichever side dialed),
// registers it as the runner's live connection and relays until it ends.
// A connection of an older generation than the live one is refused; an
// equal or newer one takes over.
func (g *Gateway) serveRunner(ctx context.Context, c *prp.Conn, mode string) {
	acc, err := g.cfg.Authority.Accept(ctx, c)
	if err != nil {
		g.log.Warn("runner handshake refused", "err", err, "mode", mode)
		_ = c.Close(websocket.StatusPolicyViolation, prp.CodeOf(err))
		return
	}
	hello := acc.Hello
	sc := hello.GetIdentity().GetSessionScope()
	inst := hello.GetIdentity().GetRunnerInstanceId()
	gen := hello.GetResume().GetConnectionGeneration()
	r := g.runnerFor(sc)
	r.mu.Lock()
	if r.instanceID != "" && r.instanceID != inst {
		r.mu.Unlock()
		g.log.Warn("runner identity mismatch", "session_scope", sc, "want", r.instanceID, "got", inst)
		_ = c.Close(websocket.StatusPolicyViolation, "runner_identity_mismatch")
		return
	}
	if r.conn != nil && gen < r.gen {
		live := r.gen
		r.mu.Unlock()
		g.refuseStale(c, inst, gen, live)
		return
	}
	r.instanceID = inst
	acked := max(r.ackedSeq, hello.GetResume().GetAckedSourceSeq())
	r.mu.Unlock()
	if err := g.cfg.Authority.Welcome(ctx, c, acc, acked); err != nil {
		_ = c.Close(websocket.StatusInternalError, "welcome failed")
		return
	}
	r.mu.Lock()
	if r.conn != nil && gen < r.gen {
		live := r.gen
		r.mu.Unlock()
		g.refuseStale(c, inst, gen, live)
		return
	}
	if old := r.conn; old != nil {
		g.log.Info("runner connection taken over by a newer generation", "runner_instance_id", inst, "old_generation", r.gen, "generation", gen)
		go func() { _ = old.Close(websocket.StatusGoingAway, "superseded by a newer connection") }()
	} else {
		close(r.connected)
	}
	r.conn, r.connID, r.hello, r.gen, r.mode = c, acc.ConnectionID, hello, gen, mode
	if r.att != nil {
		// A marker sent on the replaced connection is not answered on this
		// one; the runner begins it by sending every unacknowledged event.
		r.att.gate.Store(0)
	}
	r.provider = hello.GetProviderProcess()
	r.connectedAt = time.Now()
	r.lastPong = r.connectedAt
	r.lastCmdSeq = hello.GetResume().GetLastControllerSeq()
	r.bound, r.attachSent = nil, 0 // learnt again from this connection
	r.ackedSeq = acked
	r.lifecycle = "ready" // runnerd enters ready once welcomed; pongs refresh it
	r.mu.Unlock()
	g.log.Info("runner connected", "runner_instance_id", inst, "session_scope", sc, "acked_source_seq", acked, "mode", mode, "generation", gen)

	pctx, stopPing := context.WithCancel(ctx)
	pinged := make(chan struct{})
	go func() {
		defer close(pinged)
		g.pinger(pctx, r, c)
	}()
	err = g.readRunner(ctx, r, c)
	stopPing()
	<-pinged
	r.mu.Lock()
	if r.conn == c {
		r.conn = nil
		r.connected = make(chan struct{})
		// What the runner last reported no longer holds: it said goodbye
		// at exit, or it is reconnecting.
		r.lifecycle = LifecycleDisconnected
		if failure.CodeOf(err) == failure.RunnerExiting {
			r.lifecycle = LifecycleExited
		}
		if r.att != nil {
			// The executor re-attaches and waits for the runner to reconnect.
			r.att.close()
		}
	}
	r.mu.Unlock()
	g.log.Info("runner disconnected", "runner_instance_id", inst, "err", err)
	_ = c.Close(websocket.StatusNormalClosure, "")
}

// refuseStale closes a connection whose generation is older than the live
// one (a late handshake of a connection that was already replaced).
func (g *Gateway) refuseStale(c *prp.Conn, inst string, gen, live uint64) {
	g.log.Warn("refusing a stale runner connection", "runner_instance_id", inst, "generation", gen, "live_generation", live)
	_ = writeRunner(c, &prpv1.Frame{Kind: &prpv1.Frame_Goodbye{Goodbye: &prpv1.Goodbye{
		Code: failure.RunnerConnectionStale, Message: fmt.Sprintf("generation %d is older than the live connection's %d", gen, live)}}})
	_ = c.Close(websocket.StatusPolicyViolation, failure.RunnerConnectionStale)
}

// pinger pings the runner every PingInterval and closes the connection
// once no pong arrived for PingTimeout (a runner that stopped answering,
// or a half-open TCP connection).
func (g *Gateway) pinger(ctx context.Context, r *runner, c *prp.Conn) {
	t := time.NewTicker(g.cfg.PingInterval)
	defer t.Stop()
	var nonce uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		last := r.lastPong
		r.mu.Unlock()
		if since := time.Since(last); since > g.cfg.PingTimeout {
			g.log.Warn("runner missed its pongs; closing the connection", "runner_instance_id", r.instanceIDLocked(), "since_last_pong", since)
			_ = c.CloseNow()
			return
		}
		nonce++
		go func(n uint64) {
			_ = writeRunner(c, &prpv1.Frame{Kind: &prpv1.Frame_Ping{Ping: &prpv1.Ping{Nonce: n}}})
		}(nonce)
	}
}

func (r *runner) instanceIDLocked() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.instanceID
}

func (g *Gateway) readRunner(ctx context.Context, r *runner, c *prp.Conn) error {
	for {
		// Event batches are transcoded straight to their protobuf encoding
		// and forwarded opaquely (prp.UnmarshalRelay).
		f, err := c.ReadRelay(ctx)
		if err != nil {
			return err
		}
		r.mu.Lock()
		att := r.att
		r.mu.Unlock()
		switch k := f.GetKind().(type) {
		case *prpv1.Frame_Events:
			if att != nil && att.gate.Load() == 0 {
				att.deliver(ctx, &gatewayv1.AttachResponse{Kind: &gatewayv1.AttachResponse_Events{Events: k.Events}})
			} else {
				prp.ReleaseRelayBatch(k.Events)
			}
		case *prpv1.Frame_CommandResult:
			r.mu.Lock()
			r.answered(c, k.CommandResult)
			r.mu.Unlock()
			if att != nil {
				att.deliver(ctx, &gatewayv1.AttachResponse{Kind: &gatewayv1.AttachResponse_CommandResult{CommandResult: k.CommandResult}})
			}
		case *prpv1.Frame_Pong:
			if n := k.Pong.GetNonce(); att != nil && n != 0 {
				att.gate.CompareAndSwap(n, 0) // the replay follows
			}
			r.mu.Lock()
			r.lifecycle = k.Pong.GetLifecycle()
			r.provider = k.Pong.GetProviderProcess()
			r.lastPong = time.Now()
			r.mu.Unlock()
		case *prpv1.Frame_Goodbye:
			return failure.New(codes.Unavailable, failure.Reason(k.Goodbye.GetCode()), "%s", k.Goodbye.GetMessage())
		}
	}
}

// Runners lists the known runners.
func (g *Gateway) Runners() []*gatewayv1.Runner {
	g.mu.Lock()
	rs := make([]*runner, 0, len(g.runners))
	for _, r := range g.runners {
		rs = append(rs, r)
	}
	g.mu.Unlock()
	out := make([]*gatewayv1.Runner, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.view())
	}
	return out
}

// Runner returns one runner by instance id.
func (g *Gateway) Runner(id string) (*gatewayv1.Runner, error) {
	for _, r := range g.Runners() {
		if r.GetRunnerInstanceId() == id {
			return r, nil
		}
	}
	return nil, failure.New(codes.NotFound, failure.RunnerNotFound, "no runner %q", id)
}

// Lifecycles the gateway reports for a runner without a connection (a
// connected runner reports its own, e.g. ready, suspended).
const (
	// LifecycleDisconnected: the connection dropped; the runner may be
	// reconnecting.
	LifecycleDisconnected = "disconnected"
	// LifecycleExited: the runner process ended (it said goodbye at exit,
	// or the gateway saw its launched process exit); the process ids shown
	// are its last, no longer live.
	LifecycleExited = "exited"
)

func (r *runner) view() *gatewayv1.Runner {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil && r.child != nil && r.child.exited() {
		r.lifecycle = LifecycleExited
	}
	v := &gatewayv1.Runner{
		RunnerInstanceId: r.instanceID, SessionScope: r.scope, Lifecycle: r.lifecycle,
		Connected: r.conn != nil, AckedSourceSeq: r.ackedSeq,
		Mode: ModeEnum(r.mode),
	}
	if r.att != nil {
		v.AttachedRunId = r.att.runID
	}
	if r.hello != nil {
		v.NormalizedSessionId = r.hello.GetIdentity().GetNormalizedSessionId()
		v.CompanyId = r.hello.GetSessionInput().GetBinding().GetCompanyId()
		v.RunnerProcess = r.hello.GetRunnerProcess()
		v.ProviderProcess = r.provider
	}
	if !r.connectedAt.IsZero() {
		v.ConnectedAt = timestamppb.New(r.connectedAt)
	}
	return v
}

// Close stops the runners of this gateway (TERM, grace, KILL to each
// process group), those it launched and those it adopted.
func (g *Gateway) Close() {
	g.cancel()
	g.wg.Wait()
	g.mu.Lock()
	g.closed = true
	rs := make([]*runner, 0, len(g.runners))
	for _, r := range g.runners {
		rs = append(rs, r)
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, r := range rs {
		r.mu.Lock()
		child, hello := r.child, r.hello
		r.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if child != nil {
				stopGroup(child.cmd.Process.Pid, child.done, 3*time.Second)
			} else if p := hello.GetRunnerProcess(); processAlive(p) {
				// Adopted from an earlier gateway: stop it only while it
				// is provably the same process.
				stopGroup(int(p.GetPid()), pollExit(p), 3*time.Second)
			}
			// A provider host whose runnerd died (and was not restarted)
			// would wait for it until its detach timeout: stop it too.
			stopOrphanProviderHost(g.stateDir(r.scope))
		}()
	}
	wg.Wait()
}

// relay carries an open attachment: what the runner sends goes to the
// executor (att.out) and the executor's requests go to the runner, until
// either side ends, the attachment is superseded or the gateway drains.
func (g *Gateway) relay(ctx context.Context, stream gatewayv1.RunnerGateway_AttachServer, r *runner, att *attachment) error {
	errc := make(chan error, 1)
	go func() {
		for {
			select {
			case m := <-att.out:
				if err := stream.Send(m); err != nil {
					errc <- err
					return
				}
				// Sent: the batch's encoding is marshalled into the
				// stream's buffers; its buffer serves the next batch.
				prp.ReleaseRelayBatch(m.GetEvents())
			case <-att.done:
				errc <- nil
				return
			case <-ctx.Done():
				errc <- nil
				return
			}
		}
	}()
	recvc := make(chan error, 1)
	go func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				recvc <- err
				return
			}
			if err := g.fromExecutor(ctx, r, att, req); err != nil {
				recvc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		if err == nil {
			select {
			case <-att.done:
				return failure.New(codes.Aborted, failure.RunnerAttachmentSuperseded, "a newer attachment of run %s took over", att.runID)
			default:
			}
		}
		return err
	case <-g.cfg.Draining:
		return failure.New(codes.Unavailable, failure.RunnerGatewayDraining, "the gateway is shutting down; re-attach")
	case err := <-recvc:
		if errors.Is(err, context.Canceled) || err == nil {
			return nil
		}
		if s := err.Error(); s == "EOF" {
			return nil
		}
		return err
	}
}

// Sessions counts the session scopes this gateway holds live now (a runner
// that is neither suspended nor exited): its load in the registry.
func (g *Gateway) Sessions() int {
	n := 0
	for _, r := range g.Runners() {
		if l := r.GetLifecycle(); l != LifecycleExited && l != "suspended" {
			n++
		}
	}
	return n
}
