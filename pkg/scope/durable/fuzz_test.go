package durable

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzIdentityDocuments feeds arbitrary bytes as a scope root's
// control-plane and runner state documents: reading them never panics, an
// identity is returned only when the control plane is a complete document
// of the known schema, and the runner lifecycle is one of the four classes.
func FuzzIdentityDocuments(f *testing.F) {
	f.Add([]byte(`{"schema":"tether.runner.durable.control-plane-state.v1","identity":{"runId":"run-1","normalizedSessionId":"s","runnerInstanceId":"r","environmentLeaseId":"l"}}`),
		[]byte(`{"schema":"tether.runner.durable.state.v1","lifecycle":"suspended","identity":{"runId":"run-1","normalizedSessionId":"s","runnerInstanceId":"r","environmentLeaseId":"l"}}`))
	f.Add([]byte(`{`), []byte(`{"schema":"tether.runner.durable.state.v999","lifecycle":"ready"}`))
	f.Add([]byte(`{"schema":"tether.runner.durable.control-plane-state.v1","identity":null}`),
		[]byte(`{"schema":"tether.runner.durable.state.v1","lifecycle":"future_lifecycle","runnerInstanceId":"r","environmentLeaseId":"l","normalizedSessionId":"s"}`))
	f.Add([]byte(`[]`), []byte(``))
	f.Add([]byte(`{"schema":"tether.runner.durable.control-plane-state.v1","identity":{"runId":1}}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, controlPlane, runnerState []byte) {
		root := t.TempDir()
		for _, d := range []string{ControlPlaneDir, RunnerDir} {
			if err := os.Mkdir(filepath.Join(root, d), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, ControlPlaneDir, ControlPlaneFile), controlPlane, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, RunnerDir, RunnerStateFile), runnerState, 0o600); err != nil {
			t.Fatal(err)
		}
		id, why, err := ReadControlPlaneIdentity(root)
		if err != nil {
			t.Fatalf("a bounded document is never an error: %v", err)
		}
		if id == nil {
			if why == "" {
				t.Fatal("an indeterminate identity has a reason")
			}
			id = &Identity{}
		}
		lc, _, err := ReadRunnerLifecycle(root, *id)
		if err != nil {
			t.Fatalf("a bounded document is never an error: %v", err)
		}
		switch lc {
		case RunnerAbsent, RunnerSuspended, RunnerNotSuspended, RunnerIndeterminate:
		default:
			t.Fatalf("unknown lifecycle class %q", lc)
		}
		if lc == RunnerAbsent {
			t.Fatal("a present runner state is never absent")
		}
	})
}
