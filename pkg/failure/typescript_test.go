package failure

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tsReasons is the TypeScript client's copy of the registry (SPEC U2).
var tsReasons = filepath.Join("..", "..", "clients", "typescript", "src", "reasons.ts")

// typescriptReasons renders the registry as the TypeScript client's
// reasons.ts: the Reason type (every stable code) and each code's status
// code and retry class.
func typescriptReasons() string {
	var b strings.Builder
	b.WriteString(`// Code generated from pkg/failure's registry (reasons.go) by its test
// TestU2_TheTypeScriptClientKnowsEveryReason; DO NOT EDIT. After a change
// of the registry: TETHER_UPDATE_REASONS=1 go test -run U2 ./failure (in pkg/).

/** A stable tether failure reason (SPEC.md): the reason of a google.rpc.ErrorInfo of domain "tether". */
export type Reason =
`)
	regs := Registered()
	for i, r := range regs {
		end := ""
		if i == len(regs)-1 {
			end = ";"
		}
		fmt.Fprintf(&b, "  | %q%s\n", string(r), end)
	}
	b.WriteString(`
/** How a failure with a reason may be retried (pkg/failure's retry classes). */
export type RetryClass = "permanent" | "transient" | "attempt_retry" | "attempt_terminal";

/** Every reason's usual status code (gRPC and Connect share the numbers) and retry class. */
export const REASONS: Readonly<Record<Reason, { code: number; retry: RetryClass }>> = {
`)
	classes := map[Retry]string{Permanent: "permanent", Transient: "transient", AttemptRetry: "attempt_retry", AttemptTerminal: "attempt_terminal"}
	for _, r := range regs {
		i, _ := Lookup(r)
		fmt.Fprintf(&b, "  %q: { code: %d, retry: %q },\n", string(r), uint32(i.GRPC), classes[i.Retry])
	}
	b.WriteString("};\n")
	return b.String()
}

// TestU2_TheTypeScriptClientKnowsEveryReason: the TypeScript client's
// Reason type and table are the registry's (a reason added here and not
// there fails, so callers can switch on every reason the server sends).
func TestU2_TheTypeScriptClientKnowsEveryReason(t *testing.T) {
	want := typescriptReasons()
	if os.Getenv("TETHER_UPDATE_REASONS") == "1" {
		if err := os.WriteFile(tsReasons, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(tsReasons)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is not the registry's: TETHER_UPDATE_REASONS=1 go test -run U2 ./failure (in pkg/)", tsReasons)
	}
	if !strings.Contains(want, `"page_token_filter_mismatch": { code: 3, retry: "permanent" }`) {
		t.Fatal("the rendering lost a reason's status code or class")
	}
}
