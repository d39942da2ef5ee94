package archive

import (
	"archive/tar"
	"io"
	"io/fs"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

// DigestRules name how a checkpoint's directory digests were computed, so
// that one made under older rules still verifies under them (SPEC L5).
type DigestRules int

const (
	// DigestRulesRawDirModes: directory modes count as the archive stores
	// them (checkpoints made before SafeDirMode, SPEC S4).
	DigestRulesRawDirModes DigestRules = 1
	// DigestRulesSafeDirModes: directory modes count as SafeDirMode of the
	// stored mode, as Extract applies them.
	DigestRulesSafeDirModes DigestRules = 2
	// CurrentDigestRules are the rules new checkpoints are made with.
	CurrentDigestRules = DigestRulesSafeDirModes
)

// String names the rules as recorded and reported.
func (r DigestRules) String() string {
	switch r {
	case DigestRulesRawDirModes:
		return "raw-dir-modes"
	case DigestRulesSafeDirModes:
		return "safe-dir-modes"
	}
	return "unknown"
}

// DigestTar checks the archive read from r like Extract does and returns the
// backup directory digest (pkg/digest) of each top-level directory, computed
// from the stream without extracting anything. The archive must hold only
// directories at its top level and list each directory's entries in
// canonical walk order, as WriteTar writes them; otherwise it fails with
// failure.RunnerHarnessBackupNotCanonical or failure.RunnerRemoteCheckpointArchiveInvalid. Directory modes count as
// SafeDirMode of the stored mode, as Extract applies them, so for a
// canonical archive the digests equal digest.BackupTree of the extracted
// directories.
func DigestTar(r io.Reader, limits Limits) (map[string]digest.Result, Stats, error) {
	return DigestTarWith(r, limits, CurrentDigestRules)
}

// DigestTarWith is DigestTar under the given rules.
func DigestTarWith(r io.Reader, limits Limits, rules DigestRules) (map[string]digest.Result, Stats, error) {
	er, err := newEntryReader(r, limits)
	if err != nil {
		return nil, Stats{}, err
	}
	streams := map[string]*digest.BackupStream{}
	for {
		hdr, name, err := er.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, er.finish(), err
		}
		if name == "" {
			continue
		}
		mode := uint32(hdr.Mode) & 0o777
		top, rest, nested := strings.Cut(name, "/")
		if !nested {
			if hdr.Typeflag != tar.TypeDir {
				return nil, er.finish(), errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "top-level archive entry %q is not a directory", hdr.Name)
			}
			streams[top] = digest.NewBackupStream()
			continue
		}
		s := streams[top]
		if s == nil {
			return nil, er.finish(), errorf(codes.InvalidArgument, failure.RunnerRemoteCheckpointArchiveInvalid, "archive entry %q comes before its top-level directory", hdr.Name)
		}
		if hdr.Typeflag == tar.TypeDir {
			dm := mode
			if rules != DigestRulesRawDirModes {
				dm = uint32(SafeDirMode(fs.FileMode(mode)))
			}
			err = s.Dir(rest, dm)
		} else {
			err = s.File(rest, mode, hdr.Size, er)
		}
		if err != nil {
			return nil, er.finish(), err
		}
	}
	out := make(map[string]digest.Result, len(streams))
	for top, s := range streams {
		res, err := s.Sum()
		if err != nil {
			return nil, er.finish(), err
		}
		out[top] = res
	}
	return out, er.finish(), nil
}
