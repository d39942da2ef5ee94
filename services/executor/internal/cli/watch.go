package cli

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/tether-run/tether/pkg/backoff"
	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// maxWatchResumes bounds how often one Watch resumes on another replica.
const maxWatchResumes = 10

// Watch streams a run's events after cursor after to each, until the run's
// stream ends. When a replica ends the stream because it is draining
// (executor_draining), the watch resumes from the last event seen on the
// next of replicas (round robin: with one address behind a load balancer,
// that address again reaches another replica), so nothing is missed or
// shown twice. company names the run's company when the caller can read
// more than one ("": the only run of the id the caller can read).
func Watch(ctx context.Context, replicas []executorv1.ExecutorServiceClient, runID, company string, after uint64, each func(*executorv1.WatchRunResponse)) error {
	if len(replicas) == 0 {
		return errors.New("no executor address")
	}
	cursor := after
	// Every watcher of a draining replica resumes at once: jitter spreads
	// them over the others.
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: time.Second, Jitter: true}
	for i, resumes := 0, 0; ; {
		err := watchOnce(ctx, replicas[i%len(replicas)], &executorv1.WatchRunRequest{RunId: runID, CompanyId: company}, &cursor, each)
		// executor_draining: the replica ends the watch because it is
		// shutting down; another continues it from the last cursor.
		if err == nil || failure.CodeOf(err) != failure.ExecutorDraining || resumes >= maxWatchResumes {
			return err
		}
		resumes++
		i++
		if !backoff.Sleep(ctx, retry.Next()) {
			return ctx.Err()
		}
	}
}

func watchOnce(ctx context.Context, c executorv1.ExecutorServiceClient, req *executorv1.WatchRunRequest, cursor *uint64, each func(*executorv1.WatchRunResponse)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: req.GetRunId(), CompanyId: req.GetCompanyId(), AfterSeq: *cursor})
	if err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if m.GetSeq() <= *cursor {
			continue // already shown
		}
		*cursor = m.GetSeq()
		each(m)
	}
}
