// Package scenario holds the provider scenario suite (SPEC R2/R3): one
// sequence of provider behaviours driven through the codex driver
// (internal/codex) against a target provider. `make test` runs it against the
// fake codex app-server; `make test-codex` runs the same suite against the
// real `codex app-server` (@openai/codex, native binary) talking to the
// loopback mock Responses API of internal/mockmodel.
//
// The suite: three warm turns on one provider process with history reuse;
// steer during a slow turn; interrupt; command approval accepted and
// declined through runtime requests; a user input request answered; a
// dynamic tool call answered by a built-in handler; the provider killed
// mid-turn, the thread resumed in a new process, the killed turn reconciled
// through thread/read, and one more turn.
package scenario
