// Package statedir holds runnerd's durable truth in its state directory: the
// runner state document (atomic rewrites) and the append-only event outbox.
package statedir

import (
	"github.com/tether-run/tether/pkg/atomicfile"

	"fmt"
	"io/fs"
	"os"
	"syscall"
)

const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// EnsurePrivateDir creates dir (and parents) with mode 0700 and fails closed
// when it is a symlink or not a directory. An existing directory with group
// or other bits is tightened to 0700 — unless another user owns it: under
// uid confinement (SPEC T7) the gateway keeps the scope root (runnerd's
// state dir) its own, mode 0710 with the company's group, and it is fine
// as long as nobody but its owner can write it.
func EnsurePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 || !fi.IsDir() {
		return fmt.Errorf("%s is not a private directory (symlink or not a directory)", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		if fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("%s is another user's and writable by others (mode %o)", dir, fi.Mode().Perm())
		}
		return nil
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, dirMode); err != nil {
			return err
		}
	}
	return nil
}

// WriteFileAtomic replaces dir/name with data: an exclusive temp sibling with
// an unpredictable name, fsync, rename over the target, fsync of the dir.
func WriteFileAtomic(dir, name string, data []byte) error {
	return atomicfile.Write(dir, name, data, fileMode)
}

// SyncDir fsyncs a directory so renames and creations in it are durable.
func SyncDir(dir string) error { return atomicfile.SyncDir(dir) }

// readPrivateFile reads a regular, non-symlink file.
func readPrivateFile(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return os.ReadFile(path)
}
