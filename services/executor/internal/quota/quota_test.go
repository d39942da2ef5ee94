package quota_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/executor/internal/quota"
	"github.com/tether-run/tether/services/executor/internal/store"
)

func n(v int) *int { return &v }

// TestQ1_AdmitDecidesAtEachLimitsEdge: a submission is refused exactly at
// a limit (the count reached it), admitted below it, and a limit that is
// absent limits nothing; a warm run that opens no session is never
// refused for warm sessions.
func TestQ1_AdmitDecidesAtEachLimitsEdge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		a    store.Admission
		want failure.Reason
	}{
		{"no limits", store.Admission{QueuedRuns: 1000, WarmSessions: 1000, OpensSession: true}, ""},
		{"queued below", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(3)}, QueuedRuns: 2}, ""},
		{"queued at", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(3)}, QueuedRuns: 3}, failure.QuotaQueuedRuns},
		{"queued zero", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(0)}}, failure.QuotaQueuedRuns},
		{"warm below", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 1, OpensSession: true}, ""},
		{"warm at", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 2, OpensSession: true}, failure.QuotaWarmSessions},
		{"warm at, open session", store.Admission{Limits: store.CompanyLimits{MaxWarmSessions: n(2)}, WarmSessions: 2}, ""},
		{"queued first", store.Admission{Limits: store.CompanyLimits{MaxQueuedRuns: n(1), MaxWarmSessions: n(1)}, QueuedRuns: 1, WarmSessions: 1, OpensSession: true}, failure.QuotaQueuedRuns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, failure.CodeOf(quota.Admit(tc.a)))
		})
	}
}
