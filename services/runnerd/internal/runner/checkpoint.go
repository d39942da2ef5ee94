package runner

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/services/runnerd/internal/provhost"

	"google.golang.org/protobuf/proto"
)

// Online checkpoints (SPEC P6). runner.checkpoint stages, inside the
// runner directory, a consistent copy of the profile directories the
// gateway names while the runner is quiesced — the command runs on the
// loop, so no turn starts, no event is journaled and no state is written
// until it returns — and answers; the provider keeps running and the
// runner keeps serving. The gateway archives the staged copy (with the
// exclusions it archives a suspended root with), uploads it and removes
// it. The staged runner state is the one a suspension would have left:
// lifecycle suspended, no runner or provider process (they belong to this
// host, and a restore elsewhere must neither re-attach to nor kill them),
// the checkpoint command itself completed. A copy during which any file
// of the provider home changed is retried once, then refused: never a torn
// snapshot.

// CmdRunnerCheckpoint stages an online checkpoint (see above).
const CmdRunnerCheckpoint = prp.CommandRunnerCheckpoint

// CheckpointStageDir is where runner.checkpoint stages its copy, in the
// runner directory (the gateway excludes it from every archive).
const CheckpointStageDir = "checkpoint-stage"

// checkpointSkipped are runner-directory entries a staged copy never holds:
// the stage itself, and the provider host's live records (a restored
// runner starts its own provider).
var checkpointSkipped = []string{CheckpointStageDir, provhost.SocketName, provhost.InfoName, provhost.ExitName, provhost.LogName}

// cmdRunnerCheckpoint stages the copy (payload: dirs, the profile
// directories, runner first; home, the provider home among them; exclude,
// its top-level entries that never travel; anywhere, names that never
// travel from any depth of it; skip, top-level entries of the runner
// directory that are not archived). It answers the stage, relative to the
// state dir, and the identity the checkpoint records.
func (r *Runner) cmdRunnerCheckpoint(c *prpv1.Command) (proto.Message, *cmdError) {
	if e := r.suspendRefusal(); e != nil {
		return nil, e
	}
	if e := r.stoppedErr(); e != nil {
		return nil, e
	}
	if r.st.ProviderThreadID == "" {
		return nil, rejected(failure.RunnerStateMissing, "no provider thread to checkpoint")
	}
	spec, err := checkpointSpecOf(c)
	if err != nil {
		return nil, rejected(failure.CommandInvalid, "%v", err)
	}
	// Everything the runner holds in memory is on disk before the copy:
	// the held events journaled, the state document written (the saver's
	// earlier snapshots first).
	if err := r.j.save(); err != nil {
		return nil, failed(failure.RunnerStateWriteFailed, "%v", err)
	}
	doc, err := r.checkpointState(c)
	if err != nil {
		return nil, failed(failure.RunnerStateWriteFailed, "%v", err)
	}
	stageRel := filepath.Join("runner", CheckpointStageDir, c.GetCommandId())
	stage := filepath.Join(r.cfg.StateDir, stageRel)
	start := time.Now()
	err = stageCheckpoint(r.cfg.StateDir, stage, spec, doc)
	if errors.Is(err, errTornCopy) {
		r.log.Warn("a file changed while the checkpoint was staged; staging again", "err", err)
		err = stageCheckpoint(r.cfg.StateDir, stage, spec, doc)
	}
	if err != nil {
		_ = os.RemoveAll(filepath.Join(r.cfg.StateDir, "runner", CheckpointStageDir))
		return nil, failed(failure.RunnerRemoteCheckpointSnapshotFailed, "staging the checkpoint: %v", err)
	}
	r.log.Info("online checkpoint staged", "stage", stageRel, "took", time.Since(start).Round(time.Microsecond),
		"provider_thread_id", r.st.ProviderThreadID)
	return &prpv1.CommandOutcome{
		Stage: stageRel, ProviderThreadId: proto.String(r.st.ProviderThreadID),
		RunnerInstanceId: r.st.Identity.RunnerInstanceID, Lifecycle: r.st.Lifecycle,
	}, nil
}

// checkpointSpec is what runner.checkpoint copies.
type checkpointSpec struct {
	dirs, exclude, anywhere, skip []string
	home                          string
}

func checkpointSpecOf(c *prpv1.Command) (checkpointSpec, error) {
	b, err := prp.RunnerCheckpointOf(c)
	if err != nil {
		return checkpointSpec{}, err
	}
	s := checkpointSpec{dirs: b.GetDirs(), exclude: b.GetExclude(), anywhere: b.GetAnywhere(), skip: b.GetSkip(), home: b.GetHome()}
	if len(s.dirs) == 0 || s.dirs[0] != "runner" || !slices.Contains(s.dirs, s.home) {
		return s, fmt.Errorf("runner.checkpoint needs payload.dirs (runner first) holding payload.home")
	}
	for _, names := range [][]string{s.dirs, s.exclude, s.anywhere, s.skip} {
		if err := archive.ValidateExclusions(names); err != nil {
			return s, err
		}
	}
	return s, nil
}

// checkpointState is the runner state document the staged copy holds.
func (r *Runner) checkpointState(c *prpv1.Command) ([]byte, error) {
	b, err := runnerstate.Encode(r.st)
	if err != nil {
		return nil, err
	}
	st, err := runnerstate.Decode(b)
	if err != nil {
		return nil, err
	}
	st.Lifecycle, st.LifecycleReason = runnerstate.LifecycleSuspended, "checkpoint"
	st.RunnerProcess, st.ProviderProcess = nil, nil
	if rec := st.ProcessedCommands[c.GetCommandId()]; rec != nil {
		rec.Status, rec.Code, rec.Message = runnerstate.StatusCompleted, "", ""
		rec.Result = outcomeMap(&prpv1.CommandOutcome{Lifecycle: runnerstate.LifecycleSuspended, ProviderThreadId: proto.String(st.ProviderThreadID)})
	}
	return runnerstate.Encode(st)
}

// errTornCopy: a file changed while it was copied.
var errTornCopy = errors.New("the tree changed while it was copied")

// stageCheckpoint copies spec's directories of root into stage (replacing
// whatever a crashed checkpoint left there), with state as the runner
// state document, and syncs nothing: the stage is uploaded and removed,
// and a crash leaves only a stage the next checkpoint replaces.
func stageCheckpoint(root, stage string, spec checkpointSpec, state []byte) error {
	if err := os.RemoveAll(filepath.Dir(stage)); err != nil {
		return err
	}
	if err := os.MkdirAll(stage, 0o700); err != nil {
		return err
	}
	for _, d := range spec.dirs {
		var skip, anywhere []string
		switch d {
		case "runner":
			skip = append(append(slices.Clip(spec.skip), checkpointSkipped...), runnerstate.StateFile)
		case spec.home:
			skip, anywhere = spec.exclude, spec.anywhere
		}
		if err := copyTree(filepath.Join(root, d), filepath.Join(stage, d), skip, anywhere); err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
	}
	return os.WriteFile(filepath.Join(stage, "runner", runnerstate.StateFile), state, 0o600)
}

// copyTree copies the directories and regular files of src into dst
// (created), without the top-level entries skip and the entries named
// anywhere at any depth; another kind of entry fails (the archive would
// refuse it too). A file whose size or modification time changed while it
// was copied fails with errTornCopy.
func copyTree(src, dst string, skip, anywhere []string) error {
	fi, err := os.Lstat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(dst, 0o700)
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", src)
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		if rel != "." && (filepath.Dir(rel) == "." && slices.Contains(skip, rel) || slices.Contains(anywhere, d.Name())) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case d.Type().IsRegular():
			return copyFile(p, target, info)
		}
		return fmt.Errorf("%s is %s, which a checkpoint cannot hold", rel, info.Mode().Type())
	})
}

func copyFile(src, dst string, before fs.FileInfo) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, before.Mode().Perm())
	if err != nil {
		return err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	after, err := in.Stat()
	if err != nil {
		return err
	}
	if n != before.Size() || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		return fmt.Errorf("%w: %s", errTornCopy, src)
	}
	return os.Chtimes(dst, before.ModTime(), before.ModTime())
}
