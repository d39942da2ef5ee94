package statedir

import (
	"errors"
	"io/fs"
	"path/filepath"

	"github.com/tether-run/tether/pkg/runnerstate"
)

// Store reads and atomically rewrites the state document in Dir.
type Store struct {
	Dir string
}

// OpenStore prepares <stateDir>/runner (0700) and returns its store.
func OpenStore(stateDir string) (*Store, error) {
	if err := EnsurePrivateDir(stateDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(stateDir, "runner")
	if err := EnsurePrivateDir(dir); err != nil {
		return nil, err
	}
	return &Store{Dir: dir}, nil
}

// Load returns the stored state, or (nil, nil) when none exists.
func (s *Store) Load() (*runnerstate.State, error) {
	b, err := readPrivateFile(filepath.Join(s.Dir, runnerstate.StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return runnerstate.Decode(b)
}

// Save bounds the command journal and atomically rewrites the document.
func (s *Store) Save(st *runnerstate.State) error {
	b, err := runnerstate.Encode(st)
	if err != nil {
		return err
	}
	return s.Write(b)
}

// Write atomically replaces the document with b (from runnerstate.Encode): a temporary
// sibling, fsync, rename, directory fsync.
func (s *Store) Write(b []byte) error {
	return WriteFileAtomic(s.Dir, runnerstate.StateFile, b)
}
