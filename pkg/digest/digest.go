// Package digest computes tether's content digests: the two directory tree
// digests of the backup and provider-pack contracts, and the canonical JSON
// hash. Digests are rendered "sha256:" + lowercase hex.
//
// # Two tree algorithms
//
// The backup directory digest (BackupTree, BackupStream) and the provider-pack
// dist digest (PackTree) are different algorithms over the same kind of walk;
// never compare one with the other.
//
// Both walk the directory once, depth first, visiting the entries of each
// directory in ascending BYTE order of their names (Go string order). This is
// a deliberate difference from the reference system, which orders entries
// with a locale collation: for names made of ASCII letters of one case,
// digits, '.', '-' and '_' that begin with the same character class the two
// orders agree, but they differ e.g. for "B" vs "a" or "_x" vs "a". Trees
// produced by tether are always digested by tether, so only byte order is
// used.
//
// Relative paths join names with "/"; the directory being digested has the
// relative path "". Modes are the permission bits (mode & 0o777) written in
// DECIMAL.
//
// Backup digest (one SHA-256 over the whole walk):
//
//	empty directory (no entries):  "directory:" + rel + "\x00"
//	directory entry:               "directory:" + rel + ":" + mode + "\x00", then its entries
//	regular file entry:            "file:" + rel + ":" + mode + ":" + size + "\x00", then its bytes
//
// Result: {Digest: "sha256:<hex>", Bytes: sum of file sizes}.
//
// Provider-pack dist digest (one SHA-256 over the walk, files hashed
// separately):
//
//	directory entry:  "directory\x00" + rel + "\n", then its entries
//	file entry:       "file\x00" + rel + "\x00" + "sha256:" + hex(sha256(bytes)) + "\n"
//
// No modes and no empty-directory marker.
//
// # Refused entries
//
// Symbolic links, devices, FIFOs, sockets and every other non-regular entry
// are refused, never followed (the reference records a symlink's target; we
// refuse it). A root that is a symlink or not a directory is refused, and so
// is a tree deeper than MaxDepth. Files are opened relative to their parent
// directory's descriptor with O_NOFOLLOW, so a concurrent swap of a path
// component for a symlink cannot redirect the walk; a file whose type or size
// changes while it is read fails with failure.RunnerHarnessBackupChanged.
package digest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"runtime"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// MaxDepth is the deepest directory nesting a tree digest accepts.
const MaxDepth = 128

// Prefix is the algorithm prefix of every digest string.
const Prefix = "sha256:"

// Result is a backup directory digest.
type Result struct {
	// Digest is "sha256:" + hex.
	Digest string `json:"sha256"`
	// Bytes is the total size of the regular files.
	Bytes int64 `json:"bytes"`
}

// Options tune a tree digest. The zero value is the default.
type Options struct {
	// Workers reading (backup) or hashing (pack) files concurrently; 0 means
	// max(2, GOMAXPROCS).
	Workers int
}

func (o Options) workers() int {
	if o.Workers > 0 {
		return o.Workers
	}
	return max(2, runtime.GOMAXPROCS(0))
}

// Bytes returns "sha256:" + hex(sha256(b)).
func Bytes(b []byte) string {
	sum := sha256.Sum256(b)
	return Prefix + hex.EncodeToString(sum[:])
}

// String returns "sha256:" + hex(sha256(s)).
func String(s string) string { return Bytes([]byte(s)) }

// File returns "sha256:" + hex of the bytes of the regular file at path. It
// refuses a symlink or any non-regular file without reading it.
func File(path string) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", errors.New("not a regular file: " + path)
	}
	f, err := openNoFollow(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() || !os.SameFile(fi, st) {
		return "", errors.New("changed while opening: " + path)
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
	}
	return Prefix + hex.EncodeToString(h.Sum(nil)), nil
}

// Valid reports whether s is "sha256:" followed by 64 lowercase hex digits.
func Valid(s string) bool {
	if len(s) != len(Prefix)+64 || s[:len(Prefix)] != Prefix {
		return false
	}
	for _, c := range []byte(s[len(Prefix):]) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func backupErr(code failure.Reason, format string, args ...any) error {
	return failure.New(codes.FailedPrecondition, code, format, args...)
}

func packErr(format string, args ...any) error {
	return failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible, format, args...)
}
