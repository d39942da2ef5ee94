package archive

import (
	"archive/tar"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// WriteOptions tune WriteTar.
type WriteOptions struct {
	// Exclude lists plain top-level names of the directory that are left out
	// (with everything below them). See ValidateExclusions.
	Exclude []string
	// ExcludeAnywhere lists plain names left out at any depth (with
	// everything below them): e.g. a credential file a provider may keep
	// in any subdirectory.
	ExcludeAnywhere []string
	// Prefix, when set, puts every entry below this plain name and writes a
	// directory entry for it first (the directory's own mode).
	Prefix string
	// Limits, when set, stop the writer with the archive codes once the tree
	// is larger than an extraction with the same limits would accept.
	// MaxArchiveBytes is not checked.
	Limits *Limits
}

// WriteTar writes the tree of dir to w as a tar stream in canonical walk
// order (see the package documentation) without the end-of-archive marker
// when tw is shared; use it through Writer, or call WriteTree for a complete
// archive. Symlinks and every other non-regular entry are refused with
// failure.RunnerRemoteCheckpointArchiveUnsafeEntry, never followed; a file that changes size while it is read
// fails with failure.RunnerRemoteCheckpointSnapshotFailed. dir itself is only read.
func WriteTar(tw *tar.Writer, dir string, opts WriteOptions) (Stats, error) {
	var st Stats
	if err := ValidateExclusions(append(slices.Clip(opts.Exclude), opts.ExcludeAnywhere...)); err != nil {
		return st, err
	}
	if opts.Prefix != "" {
		if err := ValidateExclusions([]string{opts.Prefix}); err != nil {
			return st, failure.New(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive prefix %q is not a plain name", opts.Prefix)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return st, failure.Wrap(err, codes.NotFound, failure.RunnerRemoteCheckpointSourceMissing, "%s does not exist", dir)
		}
		return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
	}
	if !fi.IsDir() {
		return st, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, "%s is a symlink or not a directory", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
	}
	defer root.Close()
	var lim Limits
	if opts.Limits != nil {
		lim = opts.Limits.WithDefaults()
	}
	buf := make([]byte, 256<<10)
	name := func(p string) string {
		if opts.Prefix == "" {
			return p
		}
		if p == "." {
			return opts.Prefix
		}
		return opts.Prefix + "/" + p
	}
	fsys := root.FS()
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "reading %s: %v", p, err)
		}
		if p != "." && (filepath.Dir(p) == "." && excluded(p, opts.Exclude) || slices.Contains(opts.ExcludeAnywhere, d.Name())) {
			st.Skipped++
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if p == "." && opts.Prefix == "" {
			return nil
		}
		switch t := d.Type(); {
		case t.IsDir():
			info, err := d.Info()
			if err != nil {
				return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%s: %v", p, err)
			}
			if err := countEntry(&st, lim, opts.Limits != nil, 0); err != nil {
				return err
			}
			st.Dirs++
			return tw.WriteHeader(&tar.Header{
				Typeflag: tar.TypeDir, Name: name(p) + "/", Mode: int64(SafeDirMode(info.Mode())),
				ModTime: info.ModTime().Truncate(time.Second),
			})
		case t.IsRegular():
			return writeFile(tw, fsys, p, name(p), &st, lim, opts.Limits != nil, buf)
		default:
			return failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, "%s holds %s, which cannot be archived", p, describeMode(t))
		}
	})
	if err != nil {
		var fe *failure.Error
		if !errors.As(err, &fe) {
			err = failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
		}
	}
	return st, err
}

func countEntry(st *Stats, lim Limits, limited bool, size int64) error {
	st.Entries++
	st.Bytes += size
	if !limited {
		return nil
	}
	if st.Entries > lim.MaxEntries {
		return errorf(codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveTooManyEntries, "tree holds more than %d entries", lim.MaxEntries)
	}
	if st.Bytes > lim.MaxExpandedBytes {
		return errorf(codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveExpandedTooLarge, "tree holds more than %d bytes", lim.MaxExpandedBytes)
	}
	return nil
}

func writeFile(tw *tar.Writer, fsys fs.FS, p, name string, st *Stats, lim Limits, limited bool, buf []byte) error {
	f, err := fsys.Open(p)
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%s: %v", p, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%s: %v", p, err)
	}
	if !info.Mode().IsRegular() {
		return failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%s changed while it was archived", p)
	}
	size := info.Size()
	if err := countEntry(st, lim, limited, size); err != nil {
		return err
	}
	st.Files++
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: int64(info.Mode().Perm()), Size: size,
		ModTime: info.ModTime().Truncate(time.Second),
	}); err != nil {
		return err
	}
	left := size
	for left > 0 {
		n, err := f.Read(buf[:min(int64(len(buf)), left)])
		if n > 0 {
			if _, werr := tw.Write(buf[:n]); werr != nil {
				return werr
			}
			left -= int64(n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%s: %v", p, err)
		}
	}
	if left > 0 {
		return failure.New(codes.Aborted, failure.RunnerRemoteCheckpointSnapshotFailed, "%s shrank while it was archived", p)
	}
	if n, _ := f.Read(buf[:1]); n > 0 {
		return failure.New(codes.Aborted, failure.RunnerRemoteCheckpointSnapshotFailed, "%s grew while it was archived", p)
	}
	return nil
}

func describeMode(t fs.FileMode) string {
	switch {
	case t&fs.ModeSymlink != 0:
		return "a symlink"
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDevice != 0:
		return "a device"
	}
	return "a non-regular entry"
}

// WriteTree writes a complete tar archive of dir to w (see WriteTar).
func WriteTree(w io.Writer, dir string, opts WriteOptions) (Stats, error) {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	st, err := WriteTar(tw, dir, opts)
	if err != nil {
		return st, err
	}
	if err := tw.Close(); err != nil {
		return st, failure.Wrap(err, codes.Unavailable, failure.RunnerRemoteCheckpointSnapshotFailed, "writing archive: %v", err)
	}
	st.ArchiveBytes = cw.n
	return st, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// SnapshotOptions tune Snapshot.
type SnapshotOptions struct {
	// Exclude lists plain top-level names left out of the snapshot
	// (credentials, scratch). Anything else is failure.RunnerRemoteCheckpointExclusionInvalid.
	Exclude []string
	// Limits, when set, bound the snapshot like an extraction would.
	Limits *Limits
}

// Snapshot archives the live directory src to w without ever mutating it:
// it checks src is a real directory (failure.RunnerRemoteCheckpointSourceMissing when absent), writes
// the archive (without the excluded top-level entries) into a private
// temporary sibling ".tether-checkpoint-*" of src, so that the transfer
// reads a point-in-time copy, then streams that copy to w and removes it.
func Snapshot(src string, w io.Writer, opts SnapshotOptions) (Stats, error) {
	if err := ValidateExclusions(opts.Exclude); err != nil {
		return Stats{}, err
	}
	fi, err := os.Lstat(src)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Stats{}, failure.Wrap(err, codes.NotFound, failure.RunnerRemoteCheckpointSourceMissing, "%s does not exist", src)
	case err != nil:
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
	case !fi.IsDir():
		return Stats{}, failure.New(codes.FailedPrecondition, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, "%s is a symlink or not a directory", src)
	}
	snap, err := os.MkdirTemp(filepath.Dir(filepath.Clean(src)), ".tether-checkpoint-")
	if err != nil {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "creating snapshot directory: %v", err)
	}
	defer os.RemoveAll(snap)
	f, err := os.OpenFile(filepath.Join(snap, "snapshot.tar"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Stats{}, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
	}
	defer f.Close()
	st, err := WriteTree(f, src, WriteOptions{Exclude: opts.Exclude, Limits: opts.Limits})
	if err != nil {
		return st, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
	}
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return st, failure.Wrap(werr, codes.Unavailable, failure.RunnerRemoteCheckpointSnapshotFailed, "transferring snapshot: %v", werr)
			}
		}
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			return st, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteCheckpointSnapshotFailed, "%v", err)
		}
	}
}
