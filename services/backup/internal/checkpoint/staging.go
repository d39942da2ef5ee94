package checkpoint

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// stagingPrefix names each upload's staging directory.
const stagingPrefix = "tether-backup-upload-"

// Metrics are the verifier's domain counters.
type Metrics struct {
	// StagingCleanupFailures counts upload staging trees that could not
	// be removed (they are logged with the error).
	StagingCleanupFailures prometheus.Counter
}

// NewMetrics returns the counters, registered with reg when it is not nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		StagingCleanupFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_backup_staging_cleanup_failures_total",
			Help: "Upload staging directories that could not be removed after an upload (accepted or refused); each is logged.",
		}),
	}
	if reg != nil {
		_ = reg.Register(m.StagingCleanupFailures)
	}
	return m
}

// PrepareStaging makes dir the verifier's private staging directory (SPEC
// S4) at start: it is created 0700 when missing and must be a real
// directory (not a symlink) owned by this user, writable by nobody else,
// in which the verifier can create and remove a directory. Staging trees
// an earlier process left behind (a crash mid-upload) are removed.
func (s *Service) PrepareStaging(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.BackupStagingUnsafe, "creating staging directory %s: %v", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.BackupStagingUnsafe, "%v", err)
	}
	if !fi.IsDir() {
		return failure.New(codes.FailedPrecondition, failure.BackupStagingUnsafe,
			"staging directory %s is a symlink or not a directory: point -staging-dir at a private directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return failure.New(codes.FailedPrecondition, failure.BackupStagingUnsafe,
			"staging directory %s is owned by uid %d, not by this service's user (uid %d): chown %d %s, or point -staging-dir at a private directory",
			dir, st.Uid, os.Geteuid(), os.Geteuid(), dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return failure.New(codes.FailedPrecondition, failure.BackupStagingUnsafe,
			"staging directory %s has mode %04o, writable by other users: chmod 700 %s", dir, perm, dir)
	}
	probe, err := os.MkdirTemp(dir, stagingPrefix)
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.BackupStagingUnsafe, "staging directory %s is not writable: %v", dir, err)
	}
	if err := os.Remove(probe); err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.BackupStagingUnsafe, "staging directory %s: %v", dir, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return failure.Wrap(err, codes.FailedPrecondition, failure.BackupStagingUnsafe, "%v", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), stagingPrefix) {
			s.removeStaging(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// removeStaging removes an upload's staging tree. Extraction gives every
// directory owner rwx, so a plain RemoveAll succeeds; should it not (a
// tree from an older build, a directory made unreadable behind our back),
// the directories are given owner rwx and the removal is tried once more.
// A failure is never ignored: it is logged and counted.
func (s *Service) removeStaging(dir string) {
	err := os.RemoveAll(dir)
	if err != nil {
		openUp(dir)
		err = os.RemoveAll(dir)
	}
	if err == nil {
		return
	}
	s.log().Error("removing upload staging directory", "dir", dir, "err", err)
	if s.Metrics != nil {
		s.Metrics.StagingCleanupFailures.Inc()
	}
}

// openUp adds owner rwx to every directory of the tree at dir that this
// user owns, each before it is read, without following symlinks.
//
// The walk and the changes go through an os.Root at dir, so a directory
// swapped for a symlink mid-walk cannot make a change land outside the tree.
func openUp(dir string) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return
	}
	defer root.Close()
	_ = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if info, ierr := d.Info(); ierr == nil && info.Mode().Perm()&0o700 != 0o700 {
			_ = root.Chmod(p, info.Mode().Perm()|0o700)
		}
		return nil
	})
}
