// Package prp implements the tether runner protocol (PRP) wire: framed
// protojson messages over a WebSocket, canonical JSON, runner credentials and
// the mutual-HMAC handshake between runnerd and the runner gateway.
package prp

import (
	"errors"
	"fmt"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Protocol is the wire protocol name carried in every Hello.
const Protocol = "tether.runner"

// Version is the only PRP version this package speaks.
const Version = 1

// FeatureReplayMarker is the Hello feature of a runner that answers a
// Replay carrying a marker with a Pong of that nonce immediately before the
// replayed events (prpv1.Replay.marker).
const FeatureReplayMarker = "replay_marker"

// HasFeature reports whether the runner's hello lists feature.
func HasFeature(h *prpv1.Hello, feature string) bool {
	for _, f := range h.GetFeatures() {
		if f == feature {
			return true
		}
	}
	return false
}

// MaxFrameBytes bounds one encoded frame in either direction.
const MaxFrameBytes = 4 << 20

// EnvBootstrapTicket is the environment variable through which runnerd
// still accepts its one-use bootstrap credential (Credential.Encode form)
// for compatibility with launchers that cannot pass a descriptor. The
// gateway never uses it (SPEC S5): a process's initial environment stays
// readable in /proc/<pid>/environ for its whole life, whatever the process
// unsets; the gateway writes the ticket into a pipe runnerd inherits
// (runnerd --bootstrap-ticket-fd).
const EnvBootstrapTicket = "TETHER_RUNNER_BOOTSTRAP_TICKET"

// Credential kinds.
const (
	KindBootstrap = "bootstrap"
	KindLease     = "lease"
)

// Error is a PRP failure with a stable code.
type Error struct {
	Code    string
	Message string
	// PeerVerified is set on a refusal the gateway sent after it had proven
	// knowledge of the credential (its challenge verified): the refusal is
	// authentic. A refusal from an unverified peer may come from anyone who
	// can reach a listening runner and must not make it give up.
	PeerVerified bool
}

func (e *Error) Error() string { return failure.Message(failure.Reason(e.Code), e.Message) }

// PRP transport mode names (build metadata, flags, logs).
const (
	ModeDialWSLoopback = "dial_ws_loopback"
	ModeDialWSS        = "dial_wss"
	ModeListenWS       = "listen_ws"
)

// ArtifactKindPlan is the semantic result artifact kind that carries a
// provider plan (run.terminal artifacts).
const ArtifactKindPlan = "native_provider_plan"

// FailureReason implements failure.Reasoned.
func (e *Error) FailureReason() failure.Reason { return failure.Reason(e.Code) }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the stable code of err when it is (or wraps) a *Error, else "".
func CodeOf(err error) string {
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// PeerVerified reports whether err is a refusal from a gateway that had
// proven knowledge of the credential (see Error.PeerVerified).
func PeerVerified(err error) bool {
	var pe *Error
	return errors.As(err, &pe) && pe.PeerVerified
}
