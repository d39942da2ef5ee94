package authz_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// BenchmarkGetRun measures a GetRun over loopback gRPC and PostgreSQL in
// loopback development mode and with tenancy (token verification and the
// run's company looked up before the handler):
//
//	go test -run '^$' -bench GetRun ./services/executor/internal/authz/
func BenchmarkGetRun(b *testing.B) {
	for _, mode := range []struct {
		name string
		o    envOpts
	}{{"development", envOpts{noAuth: true}}, {"tenancy", envOpts{}}} {
		b.Run(mode.name, func(b *testing.B) {
			e := newEnv(b, mode.o)
			c := executorv1.NewExecutorServiceClient(e.as("alice", "acme:writer"))
			ctx := context.Background()
			_, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: "r1", Input: input("acme", "s", "hi")})
			require.NoError(b, err)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: "r1"}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
