package archive

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"io"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// entryReader reads a tar stream and checks every entry (see the package
// documentation) before handing it out.
type entryReader struct {
	lim      Limits
	raw      *countingReader // the stream as transferred
	inflated *countingReader // the decompressed stream (gzip only)
	gz       bool
	br       *bufio.Reader
	tr       *tar.Reader
	stats    Stats
	seen     map[string]uint8
	cur      *tar.Header
	curLeft  int64
}

const (
	seenImplicitDir uint8 = iota + 1
	seenDir
	seenFile
)

var errLimit = errors.New("archive limit exceeded")

type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
	over  bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	if c.over {
		return 0, errLimit
	}
	if rem := c.limit - c.n + 1; int64(len(p)) > rem {
		p = p[:rem] // read at most one byte past the limit
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		c.over = true
		return n, errLimit
	}
	return n, err
}

func newEntryReader(r io.Reader, lim Limits) (*entryReader, error) {
	lim = lim.WithDefaults()
	e := &entryReader{lim: lim, raw: &countingReader{r: r, limit: lim.MaxArchiveBytes}, seen: map[string]uint8{}}
	br := bufio.NewReaderSize(e.raw, 64<<10)
	e.br = br
	magic, err := br.Peek(2)
	if err != nil && len(magic) < 2 {
		if e.raw.over {
			return nil, e.tooLarge()
		}
		return nil, errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive is empty or unreadable")
	}
	var src io.Reader = br
	if magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, e.streamErr(err)
		}
		zr.Multistream(false)
		e.gz = true
		// Headers and padding cost at most the transferred size again.
		e.inflated = &countingReader{r: zr, limit: lim.MaxExpandedBytes + lim.MaxArchiveBytes}
		src = e.inflated
	}
	e.tr = tar.NewReader(src)
	return e, nil
}

func (e *entryReader) tooLarge() error {
	return errorf(codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveTooLarge, "archive is larger than %d bytes", e.lim.MaxArchiveBytes)
}

func (e *entryReader) expandedTooLarge() error {
	return errorf(codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveExpandedTooLarge, "archive expands to more than %d bytes", e.lim.MaxExpandedBytes)
}

// streamErr maps a read error of the underlying stream.
func (e *entryReader) streamErr(err error) error {
	switch {
	case e.raw.over:
		return e.tooLarge()
	case e.inflated != nil && e.inflated.over:
		return e.expandedTooLarge()
	}
	return errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive is malformed or truncated: %v", err)
}

// next returns the next entry and its normalised name ("" for the archive's
// root directory entry), or io.EOF after the last one.
func (e *entryReader) next() (*tar.Header, string, error) {
	if e.cur != nil && e.curLeft > 0 {
		// Unread data of the previous entry is skipped by tar.Reader; it
		// counts against the limits through the counting readers.
		if _, err := io.Copy(io.Discard, e); err != nil {
			return nil, "", err
		}
	}
	hdr, err := e.tr.Next()
	e.stats.ArchiveBytes = e.raw.n
	if err == io.EOF {
		if e.stats.Entries == 0 && len(e.seen) == 0 {
			return nil, "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive holds no entry")
		}
		return nil, "", io.EOF
	}
	if err != nil {
		return nil, "", e.streamErr(err)
	}
	name, err := e.check(hdr)
	if err != nil {
		return nil, "", err
	}
	e.cur, e.curLeft = hdr, 0
	if hdr.Typeflag == tar.TypeReg {
		e.curLeft = hdr.Size
	}
	return hdr, name, nil
}

func (e *entryReader) check(hdr *tar.Header) (string, error) {
	raw := hdr.Name
	name, err := normalise(raw, hdr.Typeflag == tar.TypeDir)
	if err != nil {
		return "", err
	}
	if name != "" {
		e.stats.Entries++
		if e.stats.Entries > e.lim.MaxEntries {
			return "", errorf(codes.ResourceExhausted, failure.RunnerRemoteCheckpointArchiveTooManyEntries, "archive holds more than %d entries", e.lim.MaxEntries)
		}
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir:
	default:
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, "archive entry %q is a %s", raw, typeName(hdr.Typeflag))
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafeEntry, "archive entry %q is a sparse file", raw)
		}
	}
	if hdr.Mode&(0o4000|0o2000) != 0 {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafeMode, "archive entry %q has a set-user-ID or set-group-ID bit", raw)
	}
	if hdr.Size < 0 {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry %q has a negative size", raw)
	}
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafePath, "archive entry %q names the root but is not a directory", raw)
		}
		if e.seen[""] != 0 {
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveDuplicateEntry, "archive holds the root directory twice")
		}
		e.seen[""] = seenDir
		return "", nil
	}
	// Every ancestor must be a directory; undeclared ones become implicit.
	for i := 0; i < len(name); i++ {
		if name[i] != '/' {
			continue
		}
		anc := name[:i]
		switch e.seen[anc] {
		case seenFile:
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry %q is below the file %q", raw, anc)
		case 0:
			e.seen[anc] = seenImplicitDir
		}
	}
	prev := e.seen[name]
	if hdr.Typeflag == tar.TypeDir {
		if prev == seenDir || prev == seenFile {
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveDuplicateEntry, "archive holds %q twice", name)
		}
		e.seen[name] = seenDir
		e.stats.Dirs++
		return name, nil
	}
	if prev != 0 {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveDuplicateEntry, "archive holds %q twice", name)
	}
	e.seen[name] = seenFile
	// Uncompressed data is stored verbatim: an entry declaring more than the
	// stream may still hold makes the archive too large (a size bomb).
	if !e.gz && hdr.Size > e.lim.MaxArchiveBytes-(e.raw.n-int64(e.br.Buffered())) {
		return "", e.tooLarge()
	}
	e.stats.Bytes += hdr.Size
	if e.stats.Bytes > e.lim.MaxExpandedBytes {
		return "", e.expandedTooLarge()
	}
	e.stats.Files++
	return name, nil
}

// Read reads the current entry's data.
func (e *entryReader) Read(p []byte) (int, error) {
	n, err := e.tr.Read(p)
	e.curLeft -= int64(n)
	if err != nil && err != io.EOF {
		return n, e.streamErr(err)
	}
	if err == io.EOF && e.curLeft > 0 {
		return n, e.streamErr(io.ErrUnexpectedEOF)
	}
	return n, err
}

// finish drains the stream after the end-of-archive marker (bounded by the
// limits) and returns the final stats.
func (e *entryReader) finish() Stats {
	e.stats.ArchiveBytes = e.raw.n
	return e.stats
}

// normalise returns the entry name as a clean relative path ("" for the
// root) or failure.RunnerRemoteCheckpointArchiveUnsafePath / failure.RunnerRemoteCheckpointArchiveInvalid.
func normalise(raw string, dir bool) (string, error) {
	if strings.IndexByte(raw, 0) >= 0 || strings.IndexByte(raw, '\\') >= 0 {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafePath, "archive entry name %q holds a NUL or backslash", raw)
	}
	if strings.HasPrefix(raw, "/") {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafePath, "archive entry name %q is absolute", raw)
	}
	if len(raw) > 4096 {
		return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry name is longer than 4096 bytes")
	}
	name := strings.TrimPrefix(raw, "./")
	if dir || strings.HasSuffix(name, "/") {
		name = strings.TrimSuffix(name, "/")
	}
	if name == "" || name == "." {
		return "", nil
	}
	for part := range strings.SplitSeq(name, "/") {
		switch {
		case part == "..":
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafePath, "archive entry name %q leaves the archive root", raw)
		case part == "" || part == ".":
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveUnsafePath, "archive entry name %q is not normalised", raw)
		case len(part) > 255:
			return "", errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry name %q has a component longer than 255 bytes", raw)
		}
	}
	return name, nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	case tar.TypeGNUSparse:
		return "sparse file"
	case tar.TypeCont:
		return "contiguous file"
	}
	return "non-regular entry (type " + string(rune(t)) + ")"
}
