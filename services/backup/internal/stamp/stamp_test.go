package stamp

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
)

func TestB3_StampVerifiesOnlyForItsLeaseAndBytes(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	s := &backupv1.Stamp{
		ManifestDigest: "sha256:abc", SessionScope: "scope", RunnerInstanceId: "runner-1",
		LeaseId: "lease-1", CompletedAt: timestamppb.New(time.Unix(1700000000, 5)),
	}
	Sign(key, s)
	ok, reason := Verify(key, s, "lease-1")
	require.True(t, ok, reason)

	cases := map[string]struct {
		mutate func(*backupv1.Stamp)
		lease  string
		key    []byte
		reason string
	}{
		"other lease":      {func(*backupv1.Stamp) {}, "lease-2", key, ReasonLeaseMismatch},
		"changed manifest": {func(s *backupv1.Stamp) { s.ManifestDigest = "sha256:abd" }, "lease-1", key, ReasonBadSignature},
		"changed time":     {func(s *backupv1.Stamp) { s.CompletedAt = timestamppb.New(time.Unix(1700000000, 6)) }, "lease-1", key, ReasonBadSignature},
		"rebound lease":    {func(s *backupv1.Stamp) { s.LeaseId = "lease-2" }, "lease-2", key, ReasonBadSignature},
		"other key":        {func(*backupv1.Stamp) {}, "lease-1", []byte("another key of thirty-two bytes!"), ReasonBadSignature},
		"missing field":    {func(s *backupv1.Stamp) { s.RunnerInstanceId = "" }, "lease-1", key, ReasonIncomplete},
		"garbage sig":      {func(s *backupv1.Stamp) { s.Signature = "zz" }, "lease-1", key, ReasonBadSignature},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			m := proto.Clone(s).(*backupv1.Stamp)
			c.mutate(m)
			ok, reason := Verify(c.key, m, c.lease)
			require.False(t, ok)
			require.Equal(t, c.reason, reason)
		})
	}
}
