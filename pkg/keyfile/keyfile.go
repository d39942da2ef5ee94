// Package keyfile loads a service's secret keys from private files (SPEC S3)
// and creates them on first use.
//
// A key file is trusted only when it is the file itself (not a symlink), a
// regular file, owned by the user the service runs as, and no more open
// than 0600 (0400 is fine). Anything else is refused with failure.KeyFileUnsafe and a
// message that says how to fix it, before a byte is read: a key that other
// users can read or replace is not a secret, and a symlink lets whoever
// controls its target choose the key. The checks are made on the opened
// descriptor (O_NOFOLLOW), so a file swapped between a check and the read
// cannot slip through.
//
// Created keys are written to a private temporary sibling (0600), synced,
// then linked into place with link(2), which never replaces or follows an
// existing name: two services creating the same key at once agree on one,
// and a crash never leaves a torn key behind.
package keyfile

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/atomicfile"
	"github.com/tether-run/tether/pkg/failure"
)

// Size is the length of a created key.
const Size = 32

// MaxSize bounds what Read accepts (PEM keys included).
const MaxSize = 64 << 10

// Check reports whether path is a key file this process may trust: a
// regular file (not a symlink), owned by the effective user, mode 0600 or
// stricter. A missing file is an error wrapping fs.ErrNotExist.
func Check(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	return checkInfo(path, fi)
}

func checkInfo(path string, fi fs.FileInfo) error {
	switch t := fi.Mode().Type(); {
	case t&fs.ModeSymlink != 0:
		return unsafe(path, "%s is a symlink; a key file must be the file itself: replace the link with a copy of its target (cp --remove-destination \"$(readlink -f %s)\" %s; chmod 600 %s)",
			path, path, path, path)
	case !fi.Mode().IsRegular():
		return unsafe(path, "%s is not a regular file (%v); remove it to have a new key created, or put the key in a regular file", path, t)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := os.Geteuid(); int(st.Uid) != uid {
			return unsafe(path, "%s is owned by uid %d, not by this service's user (uid %d): chown %d %s", path, st.Uid, uid, uid, path)
		}
	}
	if perm := fi.Mode().Perm(); perm&^0o600 != 0 {
		return unsafe(path, "%s has mode %04o, more open than 0600: chmod 600 %s", path, perm, path)
	}
	return nil
}

func unsafe(path, format string, args ...any) error {
	e := failure.New(codes.FailedPrecondition, failure.KeyFileUnsafe, format, args...)
	e.Metadata = map[string]string{"path": path}
	return e
}

// Read returns the content of the key file at path after Check's checks
// (made on the opened descriptor). It refuses a file larger than MaxSize.
// A missing file is an error wrapping fs.ErrNotExist.
func Read(path string) ([]byte, error) {
	// O_NOFOLLOW: a symlink fails to open (ELOOP); O_NONBLOCK: a FIFO does
	// not block the open (it is refused as not regular).
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		if fi, lerr := os.Lstat(path); lerr == nil {
			return nil, checkInfo(path, fi)
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.KeyFileInvalid, "%s: %v", path, err)
	}
	if err := checkInfo(path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.KeyFileInvalid, "reading %s: %v", path, err)
	}
	if len(b) > MaxSize {
		return nil, failure.New(codes.FailedPrecondition, failure.KeyFileInvalid, "%s is larger than %d bytes; it is not a key file", path, MaxSize)
	}
	return b, nil
}

// Create writes data as a new key file at path (0600; its directory is
// created 0700 when missing). It never replaces an existing file or follows
// a symlink: an existing path is an error wrapping fs.ErrExist.
func Create(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(data)
	err = errors.Join(werr, tmp.Chmod(0o600), tmp.Sync(), tmp.Close())
	if err != nil {
		return err
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		var le *os.LinkError
		if errors.As(err, &le) && errors.Is(le.Err, fs.ErrExist) {
			return &fs.PathError{Op: "create", Path: path, Err: fs.ErrExist}
		}
		return err
	}
	return atomicfile.SyncDir(dir)
}

// LoadOrCreate returns the key stored at path (see Read), creating the file
// with Size random bytes when it does not exist (see Create). A key shorter
// than Size is refused with failure.KeyFileInvalid.
func LoadOrCreate(path string) ([]byte, error) {
	for {
		b, err := Read(path)
		if err == nil {
			if len(b) < Size {
				return nil, failure.New(codes.FailedPrecondition, failure.KeyFileInvalid,
					"%s holds %d bytes, a key needs at least %d: remove it to have a new key created", path, len(b), Size)
			}
			return b, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		key := make([]byte, Size)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		err = Create(path, key)
		if errors.Is(err, fs.ErrExist) {
			continue // created concurrently: read theirs
		}
		if err != nil {
			return nil, fmt.Errorf("creating key file %s: %w", path, err)
		}
		return key, nil
	}
}
