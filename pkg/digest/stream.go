package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// BackupStream computes the backup directory digest from entries fed in walk
// order (each directory's entries in ascending byte order of their names,
// depth first, a directory before its entries), e.g. from a tar archive
// written by pkg/archive. It yields exactly what BackupTree yields for the
// same tree, and refuses (failure.RunnerHarnessBackupNotCanonical) an entry that is out of order, a
// repeated name, or an entry whose parent directory was not fed before it.
//
// Paths are relative to the digested directory, slash-separated, without a
// leading "./" or trailing "/".
type BackupStream struct {
	h       hash.Hash
	stack   []streamDir
	bytes   int64
	scratch []byte
	buf     []byte
	err     error
}

type streamDir struct {
	rel      string
	last     string
	children int
}

// NewBackupStream starts a digest of one directory.
func NewBackupStream() *BackupStream {
	return &BackupStream{h: sha256.New(), stack: []streamDir{{}}, scratch: make([]byte, 0, 256)}
}

// Dir feeds a directory entry with its permission bits.
func (s *BackupStream) Dir(rel string, mode uint32) error {
	if err := s.enter(rel); err != nil {
		return err
	}
	s.scratch = append(s.scratch[:0], "directory:"...)
	s.scratch = append(s.scratch, rel...)
	s.scratch = append(s.scratch, ':')
	s.scratch = strconv.AppendUint(s.scratch, uint64(mode&0o777), 10)
	s.scratch = append(s.scratch, 0)
	s.h.Write(s.scratch)
	s.stack = append(s.stack, streamDir{rel: rel})
	return nil
}

// File feeds a regular file: exactly size bytes are read from r.
func (s *BackupStream) File(rel string, mode uint32, size int64, r io.Reader) error {
	if err := s.enter(rel); err != nil {
		return err
	}
	if size < 0 {
		return s.fail("negative size for %s", rel)
	}
	s.scratch = append(s.scratch[:0], "file:"...)
	s.scratch = append(s.scratch, rel...)
	s.scratch = append(s.scratch, ':')
	s.scratch = strconv.AppendUint(s.scratch, uint64(mode&0o777), 10)
	s.scratch = append(s.scratch, ':')
	s.scratch = strconv.AppendInt(s.scratch, size, 10)
	s.scratch = append(s.scratch, 0)
	s.h.Write(s.scratch)
	if s.buf == nil {
		s.buf = make([]byte, 256<<10)
	}
	left := size
	for left > 0 {
		n, err := r.Read(s.buf[:min(int64(len(s.buf)), left)])
		s.h.Write(s.buf[:n])
		left -= int64(n)
		if err == io.EOF && left > 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil && err != io.EOF {
			s.err = err
			return err
		}
	}
	s.bytes += size
	return nil
}

// Sum ends the stream and returns the digest.
func (s *BackupStream) Sum() (Result, error) {
	if s.err != nil {
		return Result{}, s.err
	}
	for len(s.stack) > 0 {
		s.pop()
	}
	return Result{Digest: Prefix + hex.EncodeToString(s.h.Sum(nil)), Bytes: s.bytes}, nil
}

func (s *BackupStream) fail(format string, args ...any) error {
	s.err = failure.New(codes.FailedPrecondition, failure.RunnerHarnessBackupNotCanonical, format, args...)
	return s.err
}

func (s *BackupStream) pop() {
	top := s.stack[len(s.stack)-1]
	if top.children == 0 {
		s.scratch = append(s.scratch[:0], "directory:"...)
		s.scratch = append(s.scratch, top.rel...)
		s.scratch = append(s.scratch, 0)
		s.h.Write(s.scratch)
	}
	s.stack = s.stack[:len(s.stack)-1]
}

// enter checks that rel is the next entry in walk order and makes its parent
// the current directory.
func (s *BackupStream) enter(rel string) error {
	if s.err != nil {
		return s.err
	}
	if len(s.stack) == 0 {
		return s.fail("entry %q after the end of the stream", rel)
	}
	if !validRel(rel) {
		return s.fail("invalid relative path %q", rel)
	}
	parent, name := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		parent, name = rel[:i], rel[i+1:]
	}
	for len(s.stack) > 0 && s.stack[len(s.stack)-1].rel != parent {
		s.pop()
	}
	if len(s.stack) == 0 {
		return s.fail("entry %q is out of order or its directory is missing", rel)
	}
	top := &s.stack[len(s.stack)-1]
	if top.children > 0 && name <= top.last {
		return s.fail("entry %q is out of order or repeated", rel)
	}
	top.last = name
	top.children++
	return nil
}

func validRel(rel string) bool {
	if rel == "" {
		return false
	}
	for part := range strings.SplitSeq(rel, "/") {
		if part == "" || part == "." || part == ".." || strings.IndexByte(part, 0) >= 0 {
			return false
		}
	}
	return true
}
