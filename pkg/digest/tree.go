//go:build unix

package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// The walk runs in three roles: one walker goroutine lists directories in
// order and queues every regular file; a small pool of workers opens the
// queued files relative to their parent directory's descriptor (O_NOFOLLOW)
// and, for the backup digest, reads small files into pooled buffers ahead of
// the hasher, or, for the pack digest, hashes each file completely; the
// caller's goroutine consumes the entries in walk order and feeds the one
// SHA-256. A bounded window keeps memory and open descriptors small.

const (
	// smallFile: backup files below this size are read ahead by workers.
	smallFile = 64 << 10
	// window bounds the entries queued between the walker and the hasher.
	window = 128
	// chunk is the read size for streamed (large) files.
	chunk = 1 << 20
)

var smallBufs = sync.Pool{New: func() any { b := make([]byte, smallFile); return &b }}

type dirRef struct {
	f    *os.File
	fd   int
	refs atomic.Int32
}

func (d *dirRef) release() {
	if d.refs.Add(-1) == 0 {
		d.f.Close()
	}
}

type kind uint8

const (
	kDir kind = iota
	kEmpty
	kFile
	kErr
)

type item struct {
	kind kind
	rel  string
	mode uint32 // kDir: permission bits

	// kFile, set by the walker:
	parent *dirRef
	name   string
	ready  chan struct{}
	// kFile, set by a worker before ready is closed:
	size  int64
	fmode uint32
	data  *[]byte  // backup: contents of a small file (len = size)
	fd    int      // backup: open descriptor of a large file, else -1
	sum   [32]byte // pack: sha256 of the file
	err   error
}

type walker struct {
	pack   bool
	out    chan *item
	jobs   chan *item
	done   chan struct{}
	errf   func(rel string, kind string) error // unsupported entry error
	wg     sync.WaitGroup
	closed atomic.Bool
}

// BackupTree computes the backup directory digest of dir (see the package
// documentation).
func BackupTree(dir string, opts ...Options) (Result, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	w := newWalker(false, o)
	go w.run(dir)
	h := sha256.New()
	var (
		total   int64
		scratch = make([]byte, 0, 512)
		large   *streamer
		err     error
	)
loop:
	for it := range w.out {
		scratch = scratch[:0]
		switch it.kind {
		case kErr:
			err = it.err
			break loop
		case kEmpty:
			scratch = append(scratch, "directory:"...)
			scratch = append(scratch, it.rel...)
			scratch = append(scratch, 0)
			h.Write(scratch)
		case kDir:
			scratch = append(scratch, "directory:"...)
			scratch = append(scratch, it.rel...)
			scratch = append(scratch, ':')
			scratch = strconv.AppendUint(scratch, uint64(it.mode), 10)
			scratch = append(scratch, 0)
			h.Write(scratch)
		case kFile:
			<-it.ready
			if it.err != nil {
				err = it.err
				w.cleanup(it)
				break loop
			}
			scratch = append(scratch, "file:"...)
			scratch = append(scratch, it.rel...)
			scratch = append(scratch, ':')
			scratch = strconv.AppendUint(scratch, uint64(it.fmode), 10)
			scratch = append(scratch, ':')
			scratch = strconv.AppendInt(scratch, it.size, 10)
			scratch = append(scratch, 0)
			h.Write(scratch)
			if it.data != nil {
				h.Write(*it.data)
			} else {
				if large == nil {
					large = newStreamer()
				}
				if e := large.hash(h, it.fd, it.size, it.rel); e != nil {
					err = e
					w.cleanup(it)
					break loop
				}
			}
			w.cleanup(it)
			total += it.size
		}
	}
	w.stop()
	if err != nil {
		return Result{}, err
	}
	return Result{Digest: Prefix + hex.EncodeToString(h.Sum(nil)), Bytes: total}, nil
}

// PackTree computes the provider-pack dist digest of dir (see the package
// documentation). Every failure is a failure.RunnerRemoteProviderArtifactIncompatible error.
func PackTree(dir string, opts ...Options) (string, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	w := newWalker(true, o)
	go w.run(dir)
	h := sha256.New()
	var (
		scratch = make([]byte, 0, 512)
		hexsum  [64]byte
		err     error
	)
loop:
	for it := range w.out {
		scratch = scratch[:0]
		switch it.kind {
		case kErr:
			err = it.err
			break loop
		case kEmpty:
		case kDir:
			scratch = append(scratch, "directory\x00"...)
			scratch = append(scratch, it.rel...)
			scratch = append(scratch, '\n')
			h.Write(scratch)
		case kFile:
			<-it.ready
			if it.err != nil {
				err = it.err
				break loop
			}
			hex.Encode(hexsum[:], it.sum[:])
			scratch = append(scratch, "file\x00"...)
			scratch = append(scratch, it.rel...)
			scratch = append(scratch, "\x00sha256:"...)
			scratch = append(scratch, hexsum[:]...)
			scratch = append(scratch, '\n')
			h.Write(scratch)
		}
	}
	w.stop()
	if err != nil {
		var fe *failure.Error
		if errors.As(err, &fe) && fe.Code == failure.RunnerRemoteProviderArtifactIncompatible {
			return "", err
		}
		return "", failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible, "provider dist tree is unreadable: %v", err)
	}
	return Prefix + hex.EncodeToString(h.Sum(nil)), nil
}

func newWalker(pack bool, o Options) *walker {
	w := &walker{
		pack: pack,
		out:  make(chan *item, window),
		jobs: make(chan *item, window),
		done: make(chan struct{}),
	}
	if pack {
		w.errf = func(rel, what string) error { return packErr("unsupported dist entry %s (%s)", rel, what) }
	} else {
		w.errf = func(rel, what string) error {
			return backupErr(failure.RunnerHarnessBackupUnsupportedEntry, "%s (%s)", rel, what)
		}
	}
	for range o.workers() {
		w.wg.Add(1)
		go w.work()
	}
	return w
}

// stop ends the walk early or after completion and releases everything.
func (w *walker) stop() {
	if w.closed.CompareAndSwap(false, true) {
		close(w.done)
	}
	for it := range w.out {
		if it.kind == kFile {
			<-it.ready
			w.cleanup(it)
		}
	}
	w.wg.Wait()
}

func (w *walker) cleanup(it *item) {
	if it.data != nil {
		smallBufs.Put(it.data)
		it.data = nil
	}
	if it.fd >= 0 {
		unix.Close(it.fd)
		it.fd = -1
	}
}

func (w *walker) stopped() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *walker) emit(it *item) bool {
	select {
	case w.out <- it:
		return true
	case <-w.done:
		return false
	}
}

var errStopped = errors.New("digest walk stopped")

func (w *walker) run(root string) {
	defer close(w.out)
	defer close(w.jobs)
	d, err := openRootDir(root)
	if err != nil {
		w.emit(&item{kind: kErr, err: err})
		return
	}
	err = w.walk(d, "", 0)
	d.release()
	if err != nil && err != errStopped {
		w.emit(&item{kind: kErr, err: err})
	}
}

func openRootDir(root string) (*dirRef, error) {
	fd, err := openDir(unix.AT_FDCWD, root)
	if err != nil {
		switch {
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return nil, backupErr(failure.RunnerHarnessBackupUnsafeDirectory, "%s is a symlink or not a directory", root)
		case errors.Is(err, unix.ENOENT):
			return nil, failure.Wrap(&fs.PathError{Op: "open", Path: root, Err: fs.ErrNotExist}, codes.NotFound,
				failure.RunnerHarnessBackupUnreadable, "%s does not exist", root)
		}
		return nil, failure.Wrap(err, codes.FailedPrecondition, failure.RunnerHarnessBackupUnreadable, "open %s: %v", root, err)
	}
	abs, _ := filepath.Abs(root)
	d := &dirRef{f: os.NewFile(uintptr(fd), abs), fd: fd}
	d.refs.Store(1)
	return d, nil
}

func openDir(dirfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

func joinRel(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "/" + name
}

func (w *walker) walk(d *dirRef, rel string, depth int) error {
	ents, err := d.f.ReadDir(-1)
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerHarnessBackupUnreadable, "read directory %q: %v", rel, err)
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if len(ents) == 0 && !w.pack {
		if !w.emit(&item{kind: kEmpty, rel: rel}) {
			return errStopped
		}
	}
	for _, e := range ents {
		name := e.Name()
		crel := joinRel(rel, name)
		switch t := e.Type(); {
		case t == fs.ModeDir:
			if depth+1 > MaxDepth {
				if w.pack {
					return packErr("dist tree deeper than %d at %s", MaxDepth, crel)
				}
				return backupErr(failure.RunnerHarnessBackupPathTooDeep, "%s is deeper than %d", crel, MaxDepth)
			}
			cfd, err := openDir(d.fd, name)
			if err != nil {
				return w.changed(crel, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(cfd, &st); err != nil {
				unix.Close(cfd)
				return w.changed(crel, err)
			}
			if !w.emit(&item{kind: kDir, rel: crel, mode: st.Mode & 0o777}) {
				unix.Close(cfd)
				return errStopped
			}
			child := &dirRef{f: os.NewFile(uintptr(cfd), filepath.Join(d.f.Name(), name)), fd: cfd}
			child.refs.Store(1)
			err = w.walk(child, crel, depth+1)
			child.release()
			if err != nil {
				return err
			}
		case t.IsRegular():
			d.refs.Add(1)
			it := &item{kind: kFile, rel: crel, parent: d, name: name, ready: make(chan struct{}), fd: -1}
			w.jobs <- it // workers drain jobs until it is closed
			if !w.emit(it) {
				<-it.ready
				w.cleanup(it)
				return errStopped
			}
		default:
			return w.errf(crel, describe(t))
		}
	}
	return nil
}

func describe(t fs.FileMode) string {
	switch {
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeNamedPipe != 0:
		return "fifo"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeDevice != 0:
		return "device"
	}
	return "irregular"
}

func (w *walker) changed(rel string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOENT) {
		if w.pack {
			return packErr("dist entry %s changed while it was read", rel)
		}
		return failure.Wrap(err, codes.Aborted, failure.RunnerHarnessBackupChanged, "%s changed while it was read", rel)
	}
	if w.pack {
		return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible, "dist entry %s is unreadable: %v", rel, err)
	}
	return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerHarnessBackupUnreadable, "%s: %v", rel, err)
}

func (w *walker) work() {
	defer w.wg.Done()
	var h hash.Hash
	var buf []byte
	if w.pack {
		h = sha256.New()
		buf = make([]byte, 256<<10)
	}
	for it := range w.jobs {
		if w.stopped() {
			it.err = errStopped
		} else if w.pack {
			it.err = w.hashFile(it, h, buf)
		} else {
			it.err = w.readFile(it)
		}
		it.parent.release()
		close(it.ready)
	}
}

// openFile opens a queued file relative to its parent and checks it is still
// a regular file.
func (w *walker) openFile(it *item) (int, *unix.Stat_t, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(it.parent.fd, it.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, nil, w.changed(it.rel, err)
	}
	st := new(unix.Stat_t)
	if err := unix.Fstat(fd, st); err != nil {
		unix.Close(fd)
		return -1, nil, w.changed(it.rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, nil, w.changed(it.rel, unix.ENOENT)
	}
	return fd, st, nil
}

func (w *walker) readFile(it *item) error {
	fd, st, err := w.openFile(it)
	if err != nil {
		return err
	}
	it.size, it.fmode = st.Size, st.Mode&0o777
	if st.Size >= smallFile {
		it.fd = fd
		return nil
	}
	bp := smallBufs.Get().(*[]byte)
	buf := (*bp)[:smallFile]
	total := 0
	for {
		n, err := unix.Read(fd, buf[total:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			smallBufs.Put(bp)
			return failure.Wrap(err, codes.FailedPrecondition, failure.RunnerHarnessBackupUnreadable, "read %s: %v", it.rel, err)
		}
		if n == 0 {
			break
		}
		total += n
		if int64(total) > st.Size {
			break
		}
	}
	unix.Close(fd)
	if int64(total) != st.Size {
		smallBufs.Put(bp)
		return failure.New(codes.Aborted, failure.RunnerHarnessBackupChanged, "%s changed size while it was read", it.rel)
	}
	*bp = buf[:total]
	it.data = bp
	return nil
}

func (w *walker) hashFile(it *item, h hash.Hash, buf []byte) error {
	fd, st, err := w.openFile(it)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	h.Reset()
	var total int64
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return packErr("dist entry %s is unreadable: %v", it.rel, err)
		}
		if n == 0 {
			break
		}
		h.Write(buf[:n])
		total += int64(n)
	}
	if total != st.Size {
		return packErr("dist entry %s changed while it was read", it.rel)
	}
	h.Sum(it.sum[:0])
	return nil
}

// streamer reads a large file ahead of the hasher with a second goroutine so
// that reading and hashing overlap.
type streamer struct {
	free chan []byte
}

type filled struct {
	b   []byte
	err error
}

func newStreamer() *streamer {
	s := &streamer{free: make(chan []byte, 3)}
	for range 3 {
		s.free <- make([]byte, chunk)
	}
	return s
}

func (s *streamer) hash(h hash.Hash, fd int, size int64, rel string) error {
	full := make(chan filled, 3)
	stop := make(chan struct{})
	go func() {
		defer close(full)
		for {
			var b []byte
			select {
			case b = <-s.free:
			case <-stop:
				return
			}
			n, err := readFull(fd, b)
			if err != nil {
				full <- filled{b: b[:0], err: err}
				return
			}
			full <- filled{b: b[:n]}
			if n == 0 {
				return
			}
		}
	}()
	var total int64
	var err error
	for c := range full {
		if err == nil {
			switch {
			case c.err != nil:
				err = failure.Wrap(c.err, codes.FailedPrecondition, failure.RunnerHarnessBackupUnreadable, "read %s: %v", rel, c.err)
			case len(c.b) > 0:
				total += int64(len(c.b))
				if total > size {
					err = failure.New(codes.Aborted, failure.RunnerHarnessBackupChanged, "%s grew while it was read", rel)
				} else {
					h.Write(c.b)
				}
			}
			if err != nil {
				close(stop)
			}
		}
		s.free <- c.b[:cap(c.b)]
	}
	if err == nil && total != size {
		err = failure.New(codes.Aborted, failure.RunnerHarnessBackupChanged, "%s shrank while it was read", rel)
	}
	return err
}

// readFull reads until b is full or EOF; n == 0 means EOF.
func readFull(fd int, b []byte) (int, error) {
	total := 0
	for total < len(b) {
		n, err := unix.Read(fd, b[total:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	return total, nil
}

func openNoFollow(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
}
