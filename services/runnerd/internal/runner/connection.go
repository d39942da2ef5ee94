package runner

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/statedir"
)

// What a connection means for the runner: the handshake's Hello carries
// the durable cursors; a Welcome moves the acknowledged cursor and makes
// the runner ready; a lost connection counts a reconnect; frames from the
// gateway are acknowledgements, replays, commands and pings. The link
// (link.go) does the transport.

func (r *Runner) buildHello() *prpv1.Hello {
	st := r.st
	h := &prpv1.Hello{
		Identity: &prpv1.RunnerIdentity{
			RunnerInstanceId:    st.Identity.RunnerInstanceID,
			EnvironmentLeaseId:  st.Identity.EnvironmentLeaseID,
			NormalizedSessionId: st.Identity.NormalizedSessionID,
			SessionScope:        st.Identity.SessionScope,
			RunnerVersion:       r.cfg.RunnerVersion,
		},
		Resume: &prpv1.ResumeCursor{
			LastControllerSeq:    st.LastControllerCommandSeq,
			NextSourceSeq:        st.NextSourceSeq,
			AckedSourceSeq:       st.AckedSourceSeq,
			ConnectionGeneration: st.ReconnectCount,
		},
		RunnerProcess:   processProto(st.RunnerProcess),
		ProviderProcess: processProto(st.ProviderProcess),
		Lifecycle:       st.Lifecycle,
		Features:        []string{prp.FeatureReplayMarker, prp.FeatureTypedCommands},
	}
	if len(st.SessionInput) > 0 {
		in := &prpv1.ExecutionInput{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(st.SessionInput, in); err == nil {
			h.SessionInput = in
		}
	}
	return h
}

func processProto(p *runnerstate.Process) *prpv1.ProcessInfo {
	if p == nil {
		return nil
	}
	pi := &prpv1.ProcessInfo{Pid: int32(p.PID), Pgid: int32(p.PGID), StartTicks: p.StartTicks, BootId: p.BootID}
	if !p.StartedAt.IsZero() {
		pi.StartedAt = nowTS(p.StartedAt)
	}
	return pi
}

// startDial dials the gateway with a Hello of the current state.
func (r *Runner) startDial() { r.link.startDial(r.buildHello()) }

// startHandshake runs the handshake on a connection the gateway dialed in
// (listen_ws).
func (r *Runner) startHandshake(a accepted) { r.link.startHandshake(a, r.buildHello()) }

func isCredentialRefusal(err error) bool {
	switch prp.CodeOf(err) {
	case failure.RunnerAuthFailed, failure.RunnerTicketReplayed, failure.RunnerCredentialExpired:
		return true
	}
	return false
}

func (r *Runner) handleDialed(d dialResult) {
	if !d.inbound {
		r.link.dialing = false
	}
	if d.err != nil && d.inbound {
		// Anyone who reaches the listener can fail a handshake; only a
		// refusal from a gateway that proved itself counts.
		// A refusal of a credential this runner no longer holds (a ticket
		// already exchanged for a lease by a concurrent handshake) is moot.
		if !(isCredentialRefusal(d.err) && prp.PeerVerified(d.err)) || d.used.Claims != r.link.cred.Claims {
			r.log.Warn("inbound runner connection failed its handshake", "err", d.err)
			return
		}
	}
	if d.err != nil {
		if isCredentialRefusal(d.err) {
			r.log.Error("gateway refused the runner credential", "code", prp.CodeOf(d.err), "err", d.err, "credential", r.link.cred)
			r.stopProvider(prp.CodeOf(d.err))
			r.setLifecycle(runnerstate.LifecycleRecoverableFailure, prp.CodeOf(d.err))
			r.setExit(ExitCredentialRefused, prp.CodeOf(d.err), true)
			return
		}
		wait := r.link.retryLater()
		r.log.Warn("gateway connect failed", "err", d.err, "retry_in", wait)
		return
	}
	lc := r.link.adopt(d)

	wa := d.welcome.GetAckedSourceSeq()
	produced := r.st.NextSourceSeq - 1
	switch {
	case wa > produced:
		r.log.Warn("welcome ACK beyond the produced source cursor; ignored", "welcome_acked", wa, "produced", produced)
	case wa > r.st.AckedSourceSeq:
		r.applyAck(wa)
	}
	if r.st.Lifecycle == runnerstate.LifecycleConnecting {
		r.st.Lifecycle, r.st.LifecycleReason = runnerstate.LifecycleReady, ""
	}
	r.mustSave()
	r.log.Info("connected to gateway", "connection_id", lc.connectionID, "acked_source_seq", r.st.AckedSourceSeq,
		"outbox", r.j.outbox.Len(), "lease", d.welcome.GetLeaseExpiresAtUnixMs() != 0)
	r.sendRecords(r.j.outbox.After(r.st.AckedSourceSeq))
}

// dropConn closes the live connection and schedules a reconnect.
func (r *Runner) dropConn(reason string, err error) {
	if !r.link.connected() {
		return
	}
	r.log.Warn("gateway connection lost", "reason", reason, "err", err)
	r.link.drop()
	r.st.ReconnectCount++
	if r.st.Lifecycle == runnerstate.LifecycleReady {
		r.st.Lifecycle = runnerstate.LifecycleConnecting
	}
	r.mustSave()
}

// write sends a frame; a failed write drops the connection.
func (r *Runner) write(f *prpv1.Frame) {
	if err := r.link.write(f); err != nil {
		r.dropConn("write failed", err)
	}
}

// sendRecords sends journaled events (as EventBatch frames, byte for
// byte); a failed write drops the connection.
func (r *Runner) sendRecords(recs []statedir.Record) {
	if err := r.link.writeRaw(batchFrames(recs)); err != nil {
		r.dropConn("write failed", err)
	}
}

func (r *Runner) handleInbound(in inbound) {
	if !r.link.current(in.connID) {
		return // from a connection already dropped
	}
	if in.err != nil {
		r.dropConn("read failed", in.err)
		return
	}
	r.link.live.lastHeard = time.Now()
	switch k := in.f.Kind.(type) {
	case *prpv1.Frame_Ack:
		r.onAck(k.Ack.GetAckedSourceSeq())
	case *prpv1.Frame_Replay:
		after := k.Replay.GetAfterSourceSeq()
		if after < r.st.AckedSourceSeq {
			r.log.Warn("replay requested from behind the durable cursor; sending what is retained",
				"after", after, "acked_source_seq", r.st.AckedSourceSeq)
		}
		if m := k.Replay.GetMarker(); m != 0 {
			// The marker goes out in the same turn of the loop as the
			// replay: every event frame before it is also in the replay.
			r.pong(m)
		}
		r.sendRecords(r.j.outbox.After(after))
	case *prpv1.Frame_Command:
		r.lastActivity = time.Now()
		r.onCommands(in.connID, []*prpv1.Command{k.Command})
	case *prpv1.Frame_Ping:
		if r.j.ackDirty {
			// The gateway's keepalive bounds how stale the persisted
			// acknowledged cursor gets (see applyAck).
			r.mustSave()
		}
		r.pong(k.Ping.GetNonce())
	case *prpv1.Frame_Goodbye:
		r.dropConn("gateway goodbye: "+k.Goodbye.GetCode(), errors.New(k.Goodbye.GetMessage()))
	default:
		r.log.Warn("ignoring unexpected frame after welcome", "kind", fmt.Sprintf("%T", k))
	}
}

// pong answers a ping (nonce 0: unsolicited, when the provider process
// changed) with the runner's lifecycle, cursor and provider process.
func (r *Runner) pong(nonce uint64) {
	r.write(&prpv1.Frame{Kind: &prpv1.Frame_Pong{Pong: &prpv1.Pong{
		Nonce: nonce, Lifecycle: r.st.Lifecycle, AckedSourceSeq: r.st.AckedSourceSeq, OutboxBytes: r.j.outbox.Bytes(),
		ProviderProcess: processProto(r.st.ProviderProcess),
	}}})
}

// onAck applies a cumulative ACK, refusing out-of-range values.
func (r *Runner) onAck(n uint64) {
	produced := r.st.NextSourceSeq - 1
	switch {
	case n < r.st.AckedSourceSeq:
		r.log.Warn("refusing ACK: cumulative ACK cannot move behind the durable cursor", "ack", n, "acked_source_seq", r.st.AckedSourceSeq)
		return
	case n > produced:
		r.log.Warn("refusing ACK: cumulative ACK cannot move beyond the produced source cursor", "ack", n, "produced", produced)
		return
	case n == r.st.AckedSourceSeq:
		return
	}
	r.applyAck(n)
}

// applyAck moves the acknowledged cursor and trims the outbox.
//
// The cursor is persisted lazily: with the next state save (every command
// saves), at the latest at the gateway's next ping, and at exit. A stale
// cursor on disk only means that, after a crash, events the executor
// already persisted are replayed, and it drops them as identical
// duplicates; the outbox file keeps them until a compaction. Before a
// compaction the state (cursor and nextSourceSeq) is saved, so a compacted
// log never loses the seq high-water mark.
func (r *Runner) applyAck(n uint64) {
	r.st.AckedSourceSeq = n
	r.j.ackDirty = true
	r.j.outbox.Forget(n)
	if s := r.j.saveOnAck; s != 0 && n >= s {
		r.saveTurnEnd()
	}
	if r.j.outbox.CompactDue() {
		if err := r.j.save(); err != nil {
			r.log.Error("cannot persist ACK", "err", err)
			r.setExit(ExitError, failure.RunnerStateWriteFailed, true)
			return
		}
		if err := r.j.outbox.Compact(); err != nil {
			r.log.Error("outbox compaction failed", "err", err)
		}
	}
	r.relieveBackpressure()
}
