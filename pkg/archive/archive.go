// Package archive moves directory trees as tar streams safely: it snapshots a
// live directory without touching it, checks every entry of an incoming
// archive while streaming it, extracts only inside a confined root into a
// staging directory, and swaps the result into place atomically, so that an
// unsafe or oversized archive leaves the durable target exactly as it was.
//
// # Archives
//
// Archives are POSIX tar streams (USTAR, PAX for long names), optionally
// gzip-compressed on input (detected by magic bytes). Archives written here
// hold only directories and regular files, in the walk order of the backup
// digest (pkg/digest: each directory's entries in byte order, depth first),
// names relative without "./", permission bits only (mode & 0o777; for
// directories SafeDirMode of it), owner 0:0, modification times in whole
// seconds.
//
// # What an incoming archive may hold
//
// Entries are checked in stream order before anything is written for them:
//
//   - type: directories and regular files only. Symlinks, hard links,
//     character and block devices, FIFOs, sparse files, contiguous files and
//     every other type → failure.RunnerRemoteCheckpointArchiveUnsafeEntry.
//   - name: after an optional leading "./" and a trailing "/" (directories),
//     the name must be a normalised relative path: not absolute, no ".." or
//     "." or empty component, no backslash, no NUL → failure.RunnerRemoteCheckpointArchiveUnsafePath. A
//     component longer than 255 bytes or a name longer than 4096 bytes →
//     failure.RunnerRemoteCheckpointArchiveInvalid.
//   - mode: a set-user-ID or set-group-ID bit → failure.RunnerRemoteCheckpointArchiveUnsafeMode (refused, not
//     stripped: such a file never belongs in a provider home). The sticky bit
//     and everything beyond 0o777 is dropped; owners are never applied.
//     A directory's mode is taken through SafeDirMode (SPEC S4): it always
//     includes owner rwx, so a staging tree can always be removed by the
//     user who extracted it, and never group or other write.
//   - the same name twice, or a file where a directory already is (or the
//     reverse) → failure.RunnerRemoteCheckpointArchiveDuplicateEntry; an entry below a file → failure.RunnerRemoteCheckpointArchiveInvalid.
//   - limits (Limits; defaults 64 MiB, 64 MiB, 20,000 entries): bytes read
//     from the stream beyond MaxArchiveBytes, or an uncompressed entry
//     declaring more data than the stream may still hold →
//     failure.RunnerRemoteCheckpointArchiveTooLarge; file sizes adding up to more than MaxExpandedBytes (the
//     expansion of a compressed archive, checked from the headers before the
//     data is read) → failure.RunnerRemoteCheckpointArchiveExpandedTooLarge; more than MaxEntries entries →
//     failure.RunnerRemoteCheckpointArchiveTooManyEntries.
//   - a malformed or truncated stream, or one without any entry → failure.RunnerRemoteCheckpointArchiveInvalid.
//
// Extract refuses the whole archive on the first bad entry; Restore then
// removes its staging directory and never touches the target.
package archive

import (
	"io/fs"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// Default limits.
const (
	DefaultMaxArchiveBytes  = 64 << 20
	DefaultMaxExpandedBytes = 64 << 20
	DefaultMaxEntries       = 20000
)

// Limits bound an archive. A zero field means its default.
type Limits struct {
	// MaxArchiveBytes bounds the bytes of the stream as transferred
	// (compressed, for a gzip stream).
	MaxArchiveBytes int64
	// MaxExpandedBytes bounds the sum of the regular files' sizes.
	MaxExpandedBytes int64
	// MaxEntries bounds the number of entries (directories and files).
	MaxEntries int
}

// WithDefaults fills zero fields with the defaults.
func (l Limits) WithDefaults() Limits {
	if l.MaxArchiveBytes <= 0 {
		l.MaxArchiveBytes = DefaultMaxArchiveBytes
	}
	if l.MaxExpandedBytes <= 0 {
		l.MaxExpandedBytes = DefaultMaxExpandedBytes
	}
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultMaxEntries
	}
	return l
}

// Stats describe an archive that was written, checked or extracted.
type Stats struct {
	// Entries counts directories and files (not the root "." entry).
	Entries int
	Dirs    int
	Files   int
	// Bytes is the sum of the regular files' sizes.
	Bytes int64
	// ArchiveBytes is the size of the stream (as transferred).
	ArchiveBytes int64
	// Skipped counts entries dropped by an exclusion.
	Skipped int
}

// SafeDirMode is the mode a directory is archived, extracted and digested
// with (SPEC S4): its permission bits with owner rwx added and group and
// other write removed. A directory of mode 0000 or 0500 would make a staging
// tree impossible to remove for a non-root user (and 0000 impossible to
// read); one of mode 0777 would let anyone change a restored provider home.
func SafeDirMode(m fs.FileMode) fs.FileMode {
	return (m&fs.ModePerm | 0o700) &^ 0o022
}

var plainName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// ValidateExclusions checks that every exclusion is a plain top-level name:
// letters, digits, '.', '_' or '-', and neither "." nor "..". Anything else
// (a "/", "..", an empty name, spaces, shell metacharacters) is
// failure.RunnerRemoteCheckpointExclusionInvalid.
func ValidateExclusions(names []string) error {
	for _, n := range names {
		if n == "." || n == ".." || !plainName.MatchString(n) {
			return failure.New(codes.InvalidArgument, failure.RunnerRemoteCheckpointExclusionInvalid,
				"checkpoint exclusion %q is not a plain top-level name", n)
		}
	}
	return nil
}

// validateExcludePaths checks relative exclusion paths: each slash-separated
// component must be a plain name (see ValidateExclusions).
func validateExcludePaths(paths []string) error {
	for _, p := range paths {
		if p == "" {
			return failure.New(codes.InvalidArgument, failure.RunnerRemoteCheckpointExclusionInvalid, "empty checkpoint exclusion")
		}
		for part := range strings.SplitSeq(p, "/") {
			if err := ValidateExclusions([]string{part}); err != nil {
				return failure.New(codes.InvalidArgument, failure.RunnerRemoteCheckpointExclusionInvalid,
					"checkpoint exclusion %q is not a plain relative path", p)
			}
		}
	}
	return nil
}

// excluded reports whether name is one of paths or below one of them.
func excluded(name string, paths []string) bool {
	for _, p := range paths {
		if name == p || strings.HasPrefix(name, p+"/") {
			return true
		}
	}
	return false
}

// excludedAnywhere reports whether name is, or is below, an entry named by
// one of rules at any depth: a rule "dir/base" matches an entry called base
// anywhere below dir, a rule "base" one anywhere in the archive.
func excludedAnywhere(name string, rules []string) bool {
	for _, r := range rules {
		rest, base := name, r
		if i := strings.LastIndexByte(r, '/'); i >= 0 {
			if !strings.HasPrefix(name, r[:i+1]) {
				continue
			}
			rest, base = name[i+1:], r[i+1:]
		}
		for part := range strings.SplitSeq(rest, "/") {
			if part == base {
				return true
			}
		}
	}
	return false
}

func errorf(c codes.Code, code failure.Reason, format string, args ...any) error {
	return failure.New(c, code, format, args...)
}
