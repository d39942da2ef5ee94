// Package safefs writes below a directory without following symbolic links
// there: every path component below the base is opened with O_NOFOLLOW
// (openat, component by component), files are created exclusively with
// O_NOFOLLOW and renamed into place by directory descriptor, and an
// append-only file must be a regular file with one link.
//
// The gateway writes its own files into scope roots whose subtrees a
// runner under another uid (or a sandboxed provider of the gateway's own
// uid) may change at any time (SPEC T7): a link planted there must make
// the write fail, never land elsewhere. The base itself (the gateway's
// state root) is the operator's and is resolved as usual.
package safefs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrLink is wrapped by every error caused by a symbolic link (or a
// non-directory) where a directory was expected, or a link or a
// hard-linked file where a file is written.
var ErrLink = errors.New("a symbolic link or an unexpected file type is in the way")

// IsLink reports whether err is a refused link (ErrLink).
func IsLink(err error) bool { return errors.Is(err, ErrLink) }

func linkErr(op, path string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EMLINK) {
		return fmt.Errorf("%s %s: %w (%v)", op, path, ErrLink, err)
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// components splits a relative path into its names; "" and "." are none.
func components(rel string) ([]string, error) {
	rel = filepath.Clean(rel)
	if rel == "." {
		return nil, nil
	}
	if filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, fmt.Errorf("%q is not a path below the base", rel)
	}
	return strings.Split(rel, "/"), nil
}

// OpenDir opens base/rel as a directory, following no symbolic link below
// base. With create, missing components are made with mode perm (as
// MkdirAll would). The caller closes the returned directory.
func OpenDir(base, rel string, create bool, perm os.FileMode) (*os.File, error) {
	names, err := components(rel)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: base, Err: err}
	}
	path := base
	for _, name := range names {
		path = filepath.Join(path, name)
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, name, uint32(perm.Perm())); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(fd)
		if err != nil {
			return nil, linkErr("open", path, err)
		}
		fd = next
	}
	return os.NewFile(uintptr(fd), path), nil
}

// WriteFile replaces dir/name with data, mode perm, atomically: an
// exclusive temporary sibling (O_EXCL|O_NOFOLLOW, unpredictable name),
// fsync, a rename by descriptor (which replaces a link at name rather than
// following it), fsync of dir.
func WriteFile(dir *os.File, name string, data []byte, perm os.FileMode) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("%q is not a file name", name)
	}
	dfd := int(dir.Fd())
	var tmp string
	var fd int
	for i := 0; ; i++ {
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		tmp = "." + name + ".tmp-" + hex.EncodeToString(b)
		var err error
		fd, err = unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || i == 10 {
			return &os.PathError{Op: "create", Path: filepath.Join(dir.Name(), tmp), Err: err}
		}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), tmp))
	err := f.Chmod(perm.Perm()) // past the umask
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
		if err != nil {
			err = &os.PathError{Op: "rename", Path: filepath.Join(dir.Name(), name), Err: err}
		}
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return err
	}
	return dir.Sync()
}

// WriteFileAt is WriteFile into base/rel (created with mode 0700 when
// missing), following no link below base.
func WriteFileAt(base, rel, name string, data []byte, perm os.FileMode) error {
	d, err := OpenDir(base, rel, true, 0o700)
	if err != nil {
		return err
	}
	defer d.Close()
	return WriteFile(d, name, data, perm)
}

// OpenAppend opens (creating it with perm when missing) dir/name for
// appending. It refuses a link at name and anything but a regular file
// with a single link (a hard link to someone else's file).
func OpenAppend(dir *os.File, name string, perm os.FileMode) (*os.File, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return nil, linkErr("open", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w (not a regular file with one link)", path, ErrLink)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), path), nil
}

// ReadFile reads dir/name, a regular file reached without following a
// link, up to max bytes (more is an error).
func ReadFile(dir *os.File, name string, max int64) ([]byte, error) {
	path := filepath.Join(dir.Name(), name)
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, &os.PathError{Op: "open", Path: path, Err: os.ErrNotExist}
		}
		return nil, linkErr("open", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open %s: %w (not a regular file)", path, ErrLink)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, max)
	}
	return b, nil
}

// Remove removes dir/name (a file or a link itself, never its target);
// a missing name is no error.
func Remove(dir *os.File, name string) error {
	err := unix.Unlinkat(int(dir.Fd()), name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return &os.PathError{Op: "remove", Path: filepath.Join(dir.Name(), name), Err: err}
}
