// Package provhost keeps a provider process alive across a crash of
// runnerd and lets the restarted runnerd re-attach to it.
//
// The provider (codex app-server, or the fake) speaks JSON-RPC lines over
// its stdio, and exits when its stdin closes. If runnerd held those pipes
// itself, a SIGKILL of runnerd would end the provider and the turn with it.
// Instead runnerd starts a small provider host (`runnerd provider-host`, in
// its own session) that owns the provider's pipes and serves them on a unix
// socket in runnerd's private state directory. runnerd's codex driver talks
// to a shim (`runnerd provider-shim`) that connects its stdio to that socket.
// When runnerd dies, the shim dies with it, the host keeps the provider and
// buffers its output; the restarted runnerd starts a new shim that
// re-attaches.
//
// Exactly-once events across a re-attach. The host numbers every provider
// notification and server request (a host seq, monotonic per state
// directory: a new host continues from the seq base runnerd gives it) and
// follows each one, on the wire to the driver, with a mark line — a codex
// `warning` notification whose message is MarkPrefix+seq. The driver turns
// it into a provider.notice.recorded event in order, the runnerd adapter
// turns that into a cursor, and runnerd journals the cursor together with
// the events that came before it (same fsync). A re-attaching shim sends the
// durable cursor; the host replays exactly the lines after it, so every
// provider line yields its events once.
//
// Re-attach handshake. The host answers the new driver's `initialize` from
// the cached first answer and drops its `initialized`; everything else goes
// to the provider with request ids rewritten per client generation (answers
// to a dead client's requests are dropped). The replay is held back until
// the new driver's thread/resume (or thread/start) answer was delivered, so
// the driver knows the thread; if a turn was active at the cursor, the host
// first re-sends that turn's original turn/started line preceded by a mark
// AdoptPrefix+turnId (the adapter suppresses the duplicate turn.started
// event it causes) so the driver tracks the turn and accepts its end.
// Server requests at or before the cursor that the dead client never
// answered are answered by the host with a JSON-RPC error.
package provhost

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/procid"
	"github.com/tether-run/tether/services/runnerd/internal/jsonrpc"
)

// Files in runnerd's runner directory.
const (
	SocketName = "provider.sock"
	InfoName   = "provider-host.json"
	LogName    = "provider-host.log"
	InfoSchema = "tether.runner.provider-host.v1"
)

// In-band marks (codex `warning` notifications) from the host to runnerd.
const (
	MarkPrefix  = "tether-provider-host:mark:"
	AdoptPrefix = "tether-provider-host:adopt:"
)

// Limits.
const (
	// MaxLineBytes bounds one provider line the host buffers; a longer line
	// is cut to MaxLineBytes+1 bytes, which the driver rejects as
	// provider_frame_too_large (its limit is 4 MiB).
	MaxLineBytes = 4<<20 + 64<<10
	// DefaultRetainBytes bounds the replay buffer; a re-attach from behind
	// what was dropped is refused (the provider is then treated as lost).
	DefaultRetainBytes = 64 << 20
	maxHandshakeBytes  = 4 << 10
	maxStderrLogBytes  = 4 << 20
)

// Info is provider-host.json: the host's and the provider's identity.
type Info struct {
	Schema             string    `json:"schema"`
	HostPID            int       `json:"hostPid"`
	HostStartTicks     uint64    `json:"hostStartTicks"`
	ProviderPID        int       `json:"providerPid"`
	ProviderPGID       int       `json:"providerPgid"`
	ProviderStartTicks uint64    `json:"providerStartTicks"`
	ProviderStartedAt  time.Time `json:"providerStartedAt"`
	SeqBase            uint64    `json:"seqBase"`
	BootID             string    `json:"bootId,omitempty"`
}

// ReadInfo reads dir/provider-host.json.
func ReadInfo(dir string) (*Info, error) {
	b, err := os.ReadFile(filepath.Join(dir, InfoName))
	if err != nil {
		return nil, err
	}
	var in Info
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	if in.Schema != InfoSchema {
		return nil, fmt.Errorf("%s: unknown schema %q", InfoName, in.Schema)
	}
	return &in, nil
}

func writeInfo(dir string, in *Info) error {
	b, err := json.MarshalIndent(in, "", "  ")
	if err != nil {
		return err
	}
	return atomicWrite(dir, InfoName, append(b, '\n'))
}

// atomicWrite replaces dir/name with b: a synced temp sibling renamed into
// place, then the directory synced.
func atomicWrite(dir, name string, b []byte) error {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	f.Close()
	if err := os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		os.Remove(f.Name())
		return err
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ExitName is the file in which a host records how its provider ended.
const (
	ExitName   = "provider-exit.json"
	ExitSchema = "tether.runner.provider-exit.v1"
)

// Exit is provider-exit.json: how the hosted provider ended, as its host
// reaped it ("killed by signal SIGKILL", "exited with status 1"). It is
// written before the host closes its client, so a driver that sees its
// shim end can name the provider's real cause instead of the shim's.
type Exit struct {
	Schema      string    `json:"schema"`
	ProviderPID int       `json:"providerPid"`
	Description string    `json:"description"`
	At          time.Time `json:"at"`
}

// ReadExit reads dir/provider-exit.json; nil when there is none (the
// provider still runs, or its host died with it).
func ReadExit(dir string) *Exit {
	b, err := os.ReadFile(filepath.Join(dir, ExitName))
	if err != nil {
		return nil
	}
	var e Exit
	if json.Unmarshal(b, &e) != nil || e.Schema != ExitSchema || e.Description == "" {
		return nil
	}
	return &e
}

func writeExit(dir string, e Exit) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return atomicWrite(dir, ExitName, b)
}

// HostAlive reports whether the recorded host process still runs (same pid
// and start time, same boot).
func (in *Info) HostAlive() bool {
	return in != nil && sameProcessAlive(in.HostPID, in.HostStartTicks, in.BootID)
}

// ProviderAlive reports whether the recorded provider process still runs.
func (in *Info) ProviderAlive() bool {
	return in != nil && sameProcessAlive(in.ProviderPID, in.ProviderStartTicks, in.BootID)
}

func sameProcessAlive(pid int, ticks uint64, boot string) bool { return procid.Alive(pid, ticks, boot) }

// StartTicks reads field 22 of /proc/<pid>/stat; a zombie counts as gone.
func StartTicks(pid int) (uint64, error) { return procid.StartTicks(pid) }

func bootID() string { return procid.BootID() }

// handshake is the shim's first line to the host.
type handshake struct {
	Reattach    bool   `json:"reattach"`
	ResumeAfter uint64 `json:"resumeAfter"`
}

// handshakeReply is the host's first line to the shim.
type handshakeReply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// noticeLine is a codex `warning` notification carrying msg.
func noticeLine(msg string) []byte {
	return jsonrpc.EncodeNotification("warning", map[string]any{"message": msg})
}

// ParseMark reads a host mark from a provider.notice.recorded message:
// a cursor (MarkPrefix) or a turn to adopt (AdoptPrefix).
func ParseMark(msg string) (cursor uint64, adoptTurn string, ok bool) {
	switch {
	case strings.HasPrefix(msg, MarkPrefix):
		n, err := strconv.ParseUint(msg[len(MarkPrefix):], 10, 64)
		return n, "", err == nil
	case strings.HasPrefix(msg, AdoptPrefix):
		return 0, msg[len(AdoptPrefix):], true
	}
	return 0, "", false
}
