package main

import (
	"context"
	"fmt"
	"io"

	"github.com/tether-run/tether/pkg/pgstore/migratecli"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// partitionEventsStep is `executor migrate -partition-events` (SPEC L2):
// partition executor.events by its runs' creation time once every executor
// writes run_created_at; refused while an older one is alive.
var partitionEventsStep = migratecli.Step{
	Flag:  "partition-events",
	Usage: "after migrating, partition executor.events by run creation time (SPEC L2, once; then only creates partitions ahead): refused while an executor of an older release is alive (run it after every executor was upgraded)",
	Run: func(ctx context.Context, dsn string, w io.Writer) error {
		st, err := store.Open(ctx, dsn, nil)
		if err != nil {
			return err
		}
		defer st.Close()
		return st.PartitionEvents(ctx, store.PartitionOptions{Logf: func(format string, args ...any) {
			fmt.Fprintf(w, "executor: "+format+"\n", args...)
		}})
	},
}
