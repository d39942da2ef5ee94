package fakecodex

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/synctrace"
	"github.com/tether-run/tether/services/runnerd/internal/codex/codexwire"
)

// stateVersion identifies the on-disk layout of the fake's state file.
const stateVersion = 1

// persisted is the whole state file. It is rewritten atomically after every
// change that matters for a later process (thread creation, turn start, turn
// end).
type persisted struct {
	Version    int                     `json:"version"`
	NextThread int                     `json:"nextThread"`
	NextTurn   int                     `json:"nextTurn"`
	Threads    map[string]*threadState `json:"threads"`
}

type threadState struct {
	ID             string          `json:"id"`
	Seq            int             `json:"seq"`
	Cwd            string          `json:"cwd"`
	Model          string          `json:"model"`
	ApprovalPolicy string          `json:"approvalPolicy"`
	Sandbox        string          `json:"sandbox"`
	DynamicTools   json.RawMessage `json:"dynamicTools,omitempty"`
	Ephemeral      bool            `json:"ephemeral,omitempty"`
	Originator     string          `json:"originator,omitempty"`
	CreatedAt      int64           `json:"createdAt"`
	UpdatedAt      int64           `json:"updatedAt"`
	Turns          []*turnState    `json:"turns"`
	Usage          usageState      `json:"usage"`
}

type turnState struct {
	ID          string       `json:"id"`
	Status      string       `json:"status"`
	Items       []*itemState `json:"items"`
	StartedAtMs int64        `json:"startedAtMs"`
	EndedAtMs   int64        `json:"endedAtMs,omitempty"`
}

type itemState struct {
	Type          string   `json:"type"`
	ID            string   `json:"id"`
	Texts         []string `json:"texts,omitempty"`
	Text          string   `json:"text,omitempty"`
	StartedAtMs   int64    `json:"startedAtMs"`
	CompletedAtMs int64    `json:"completedAtMs"`
}

type usageState struct {
	Total codexwire.TokenCounts `json:"total"`
	Last  codexwire.TokenCounts `json:"last"`
}

func newPersisted() *persisted {
	return &persisted{Version: stateVersion, Threads: map[string]*threadState{}}
}

// loadState reads the state file. A missing file is not an error: it yields
// an empty state and exists=false.
func loadState(path string) (st *persisted, exists bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return newPersisted(), false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read state file: %w", err)
	}
	st = newPersisted()
	if err := json.Unmarshal(data, st); err != nil {
		return nil, true, fmt.Errorf("parse state file %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, true, fmt.Errorf("state file %s: unsupported version %d", path, st.Version)
	}
	if st.Threads == nil {
		st.Threads = map[string]*threadState{}
	}
	return st, true, nil
}

// saveState writes the state atomically: temp file in the same directory,
// fsync, rename over the target, fsync the directory. Ephemeral threads are
// left out, as the real server writes no rollout for them.
func saveState(path string, st *persisted) error {
	defer synctrace.Begin("provider.save", "")()
	out := &persisted{
		Version:    stateVersion,
		NextThread: st.NextThread,
		NextTurn:   st.NextTurn,
		Threads:    make(map[string]*threadState, len(st.Threads)),
	}
	for id, th := range st.Threads {
		if !th.Ephemeral {
			out.Threads[id] = th
		}
	}
	// One line, not indented: the indentation doubled the bytes every
	// save encoded, wrote and every refresh parsed again (a save rewrites
	// the whole history of the file's threads), CPU the stack's turn and
	// the direct turn both paid on two shared cores.
	data, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp state file: %w", err)
	}
	tmpName := tmp.Name()
	cleanup := func() { _ = os.Remove(tmpName) }
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		cleanup()
		return fmt.Errorf("write temp state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		cleanup()
		return fmt.Errorf("fsync temp state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		cleanup()
		return fmt.Errorf("close temp state file: %w", err)
	}
	if err := os.Rename(tmpName, path); err != nil {
		cleanup()
		return fmt.Errorf("rename state file: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
