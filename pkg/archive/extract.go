package archive

import (
	"archive/tar"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// ExtractOptions tune Extract and Restore.
type ExtractOptions struct {
	// Limits bound the archive; zero fields take the defaults.
	Limits Limits
	// Exclude lists relative paths (plain names joined by "/") whose entries,
	// and everything below them, are checked like any other entry but never
	// written: credentials and scratch never reach the staging directory.
	Exclude []string
	// ExcludeAnywhere names entries left out at any depth, like Exclude:
	// "dir/base" drops every entry called base anywhere below dir (and
	// everything below it), a plain "base" every such entry in the archive
	// (SPEC S4: every codex-home/**/auth.json).
	ExcludeAnywhere []string
	// Top, when non-empty, is the set of names allowed at the top level of
	// the archive, each of which must be a directory; any other top-level
	// entry is failure.RunnerRemoteCheckpointArchiveInvalid.
	Top []string
}

// Extract checks and extracts the archive read from r into dir, which must
// be an existing empty directory. Every file and directory is created through
// an os.Root confined to dir, with O_EXCL, permission bits mode & 0o777
// (directories: SafeDirMode, applied last, deepest first, with their times). On the first
// bad entry it stops and returns that entry's code; dir then holds a partial
// extraction that the caller discards (Restore does).
func Extract(r io.Reader, dir string, opts ExtractOptions) (Stats, error) {
	if err := validateExcludePaths(append(slices.Clip(opts.Exclude), opts.ExcludeAnywhere...)); err != nil {
		return Stats{}, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "opening staging directory: %v", err)
	}
	defer root.Close()
	er, err := newEntryReader(r, opts.Limits)
	if err != nil {
		return Stats{}, err
	}
	type dirFix struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirFix
	buf := make([]byte, 128<<10)
	skipped := 0
	for {
		hdr, name, err := er.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return er.finish(), err
		}
		if name == "" {
			continue
		}
		if len(opts.Top) > 0 {
			top, _, nested := strings.Cut(name, "/")
			if !slices.Contains(opts.Top, top) || !nested && hdr.Typeflag != tar.TypeDir {
				return er.finish(), errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "unexpected top-level archive entry %q", hdr.Name)
			}
		}
		if excluded(name, opts.Exclude) || excludedAnywhere(name, opts.ExcludeAnywhere) {
			skipped++
			continue
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		if i := strings.LastIndexByte(name, '/'); i >= 0 {
			if err := root.MkdirAll(name[:i], 0o700); err != nil {
				return er.finish(), ioErr(err, name)
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return er.finish(), ioErr(err, name)
			}
			dirs = append(dirs, dirFix{name: name, mode: SafeDirMode(mode), mtime: hdr.ModTime})
			continue
		}
		if err := extractFile(root, er, name, mode, hdr.Size, buf); err != nil {
			return er.finish(), err
		}
		if !hdr.ModTime.IsZero() {
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	// Implicit directories may have been created by MkdirAll; an explicit
	// entry for one after its contents is fine (it was created with 0o700).
	slices.SortStableFunc(dirs, func(a, b dirFix) int {
		return strings.Count(b.name, "/") - strings.Count(a.name, "/")
	})
	for _, d := range dirs {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return er.finish(), ioErr(err, d.name)
		}
		if !d.mtime.IsZero() {
			_ = root.Chtimes(d.name, d.mtime, d.mtime)
		}
	}
	st := er.finish()
	st.Skipped = skipped
	return st, nil
}

func extractFile(root *os.Root, er *entryReader, name string, mode fs.FileMode, size int64, buf []byte) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return ioErr(err, name)
	}
	var written int64
	for written < size {
		n, rerr := er.Read(buf[:min(int64(len(buf)), size-written)])
		if n > 0 {
			if _, werr := f.Write(buf[:n]); werr != nil {
				f.Close()
				return ioErr(werr, name)
			}
			written += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			f.Close()
			return rerr
		}
	}
	if written != size {
		f.Close()
		return errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry %q is truncated", name)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return ioErr(err, name)
	}
	if err := f.Close(); err != nil {
		return ioErr(err, name)
	}
	return nil
}

func ioErr(err error, name string) error {
	var fe *failure.Error
	if errors.As(err, &fe) {
		return err
	}
	if errors.Is(err, fs.ErrExist) {
		return failure.Wrap(err, codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveDuplicateEntry, "archive holds %q twice", name)
	}
	return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "extracting %q: %v", name, err)
}

// Check reads the whole archive and checks every entry without writing
// anything.
func Check(r io.Reader, limits Limits) (Stats, error) {
	er, err := newEntryReader(r, limits)
	if err != nil {
		return Stats{}, err
	}
	for {
		_, _, err := er.next()
		if err == io.EOF {
			return er.finish(), nil
		}
		if err != nil {
			return er.finish(), err
		}
	}
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	ExtractOptions
	// Mode of the restored directory; default 0o700.
	Mode fs.FileMode
}

// Restore replaces the directory target with the archive read from r. It
// extracts into a private staging directory ".tether-checkpoint-*" next to
// target and, only when every entry was safe and written, swaps the staged
// tree into place atomically (renameat2 RENAME_EXCHANGE on Linux; otherwise
// rename the old tree aside, rename the new one in, and put the old one back
// on failure), then removes the old tree. On any error the staging directory
// is removed and target is left exactly as it was. target's parent must
// exist; target itself may be absent.
func Restore(r io.Reader, target string, opts RestoreOptions) (Stats, error) {
	target = filepath.Clean(target)
	if opts.Mode == 0 {
		opts.Mode = 0o700
	}
	if fi, err := os.Lstat(target); err == nil {
		if !fi.IsDir() {
			return Stats{}, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointTargetUnsafe, "restore target %s is a symlink or not a directory", target)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	stage, err := os.MkdirTemp(filepath.Dir(target), ".tether-checkpoint-")
	if err != nil {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "creating staging directory: %v", err)
	}
	defer os.RemoveAll(stage)
	payload := filepath.Join(stage, "payload")
	if err := os.Mkdir(payload, 0o700); err != nil {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	st, err := Extract(r, payload, opts.ExtractOptions)
	if err != nil {
		return st, err
	}
	if err := os.Chmod(payload, opts.Mode&fs.ModePerm); err != nil {
		return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "%v", err)
	}
	if err := swap(payload, target, filepath.Join(stage, "previous")); err != nil {
		return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointRestoreFailed, "swapping %s into place: %v", target, err)
	}
	return st, nil
}

// swapByRename moves target aside to previous, staged to target, and puts
// previous back if the second rename fails.
func swapByRename(staged, target, previous string) error {
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return os.Rename(staged, target)
	}
	if err := os.Rename(target, previous); err != nil {
		return err
	}
	if err := os.Rename(staged, target); err != nil {
		if rerr := os.Rename(previous, target); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	return nil
}
