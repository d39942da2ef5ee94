// Package conformance checks that the repository keeps its own rules. It
// has no code of its own; its tests walk the repository:
//
//   - docs/behaviours.md, the catalogue of behaviour IDs (E7, R13, …),
//     explains every ID a test name or a "SPEC" citation uses;
//   - the service binaries (executor, tetherctl, runnergw, runnerd,
//     backup-verifier) link no test double, mock model, harness or bench;
//   - test doubles, test helpers, the harness, the benches and the demo live
//     in pkg/testing, a service's internal/testing or its tools/, and a
//     service's cmd/ holds only the binaries tether ships;
//   - no service binary links two tether packages of one name;
//   - the gRPC bootstrap (pkg/grpcx) links only the few tether packages
//     it needs;
//   - no function of non-test, non-generated Go code is over 100 lines,
//     and no main package's run over 60 (flags → config → wiring →
//     serving).
package conformance
