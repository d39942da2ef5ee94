package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffDoublesUpToMaxAndResets(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: 100 * time.Millisecond, Max: 350 * time.Millisecond}
	var got []time.Duration
	for range 5 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 350 * time.Millisecond, 350 * time.Millisecond, 350 * time.Millisecond}, got)
	b.Reset()
	require.Equal(t, 100*time.Millisecond, b.Next())
}

func TestJitterStaysWithinHalfToWhole(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: time.Second, Max: time.Second, Jitter: true}
	for range 1000 {
		d := b.Next()
		require.GreaterOrEqual(t, d, 500*time.Millisecond)
		require.LessOrEqual(t, d, time.Second)
	}
	require.Zero(t, Jittered(0))
}

func TestSleepEndsWithItsContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Sleep(ctx, time.Hour))
	require.True(t, Sleep(context.Background(), 0))
}
