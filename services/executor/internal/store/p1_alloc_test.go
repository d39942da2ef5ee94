package store_test

import (
	"strings"
	"testing"

	"github.com/tether-run/tether/services/executor/internal/store"
)

// TestP1_TheGatedAttachReadsAreFormattedOnce: SubmitClaim's gated reads
// (one per attach fact, queued on every submission) are built once, not
// formatted on every call (≈ 4 % of the executor's CPU per SubmitRun).
func TestP1_TheGatedAttachReadsAreFormattedOnce(t *testing.T) {
	const read = `SELECT 1 FROM executor.runs WHERE run_id = $1 AND company_id = $2`
	first := store.ClaimedHere(read, 2)
	if !strings.Contains(first, "g.run_id = $3") || !strings.Contains(first, read) {
		t.Fatalf("gated read: %s", first)
	}
	if n := testing.AllocsPerRun(100, func() {
		if store.ClaimedHere(read, 2) != first {
			t.Fatal("the gated read changed")
		}
	}); n != 0 {
		t.Errorf("a gated read allocates %.0f times per submission, want 0", n)
	}
	if other := store.ClaimedHere(read, 3); !strings.Contains(other, "g.run_id = $4") {
		t.Errorf("another parameter count: %s", other)
	}
}
