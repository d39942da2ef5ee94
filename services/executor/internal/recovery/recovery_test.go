package recovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tether-run/tether/pkg/failure"
)

func TestE11_PreservesStableProviderAndRunnerFailureCauses(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"frame too large", failure.New(codes.Unavailable, "provider_frame_too_large", "harness stdout frame exceeded 4194304 bytes"), "provider_frame_too_large"},
		{"runner exited", failure.New(codes.Unavailable, "native_runner_process_exited", "runnerd exited unexpectedly with code 1"), "native_runner_process_exited"},
		{"transport", failure.New(codes.Unavailable, "provider_transport_failed", "invalid JSON-RPC"), "provider_transport_failed"},
		{"planning", failure.New(codes.Unavailable, "planning_mode_unsupported", "installed Codex app-server did not confirm plan mode"), "planning_mode_unsupported"},
		{"replay conflict", failure.New(codes.Unavailable, "native_event_replay_conflict", "source sequence 41 contained different bytes"), "native_event_replay_conflict"},
		{"process exited", failure.New(codes.Unavailable, "provider_process_exited", "provider=codex stage=initialize exitCode=1"), "provider_process_exited"},
		{"stdout closed", failure.New(codes.Unavailable, "provider_stdout_closed", "provider=codex stage=initialize"), "provider_stdout_closed"},
		{"status failed", failure.New(codes.Unavailable, "provider_process_status_failed", "provider=codex stage=session.open"), "provider_process_status_failed"},
		{"initialize timeout", failure.New(codes.Unavailable, "provider_initialize_timeout", "provider=codex stage=initialize"), "provider_initialize_timeout"},
		{"initialize protocol", failure.New(codes.Unavailable, "provider_initialize_protocol_error", "provider=codex stage=initialize"), "provider_initialize_protocol_error"},
		{"request timeout", failure.New(codes.Unavailable, "provider_request_timeout", "provider=codex stage=turn.start"), "provider_request_timeout"},
		{"artifact incompatible", failure.New(codes.Unavailable, "runner_remote_provider_artifact_incompatible", "OpenCode version mismatch"), "runner_remote_provider_artifact_incompatible"},
		// Beyond the seed: how the cause travels in tether, and what is not a cause.
		{"failure error wrapped", fmt.Errorf("attempt 2: %w", failure.New(codes.Unavailable, "provider_stdout_closed", "provider=codex")), "provider_stdout_closed"},
		{"grpc status", failure.New(codes.Unavailable, "provider_request_timeout", "provider=codex stage=turn.start").GRPCStatus().Err(), "provider_request_timeout"},
		// The reason travels as a value, never parsed from a message.
		{"message only", errors.New("provider_frame_too_large: harness stdout frame exceeded 4194304 bytes"), ""},
		{"status message only", status.Error(codes.Unavailable, "provider_request_timeout: provider=codex stage=turn.start"), ""},
		{"unknown code", failure.New(codes.Aborted, "native_session_supervisor_busy", "scope held"), ""},
		{"no code", errors.New("connection reset by peer"), ""},
		{"code not leading", errors.New("runnerd: provider_frame_too_large: too big"), ""},
		{"nil", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, failure.Reason(tc.want), SourceCode(tc.err))
		})
	}
}

func TestE11_RetriesTheSameRunTwiceAndStopsAtTheThirdFailedAttempt(t *testing.T) {
	now := time.Date(2026, 8, 9, 0, 0, 0, 0, time.UTC)
	next := time.Date(2026, 8, 9, 0, 0, 30, 0, time.UTC)
	cases := []struct {
		name    string
		attempt int
		source  failure.Reason
		want    Decision
	}{
		{"first attempt", 1, "", Decision{Phase: "retryable_failure", FailureCode: "native_session_interrupted", NextAttemptAt: &next}},
		{"second attempt", 2, "", Decision{Phase: "retryable_failure", FailureCode: "native_session_interrupted", NextAttemptAt: &next}},
		{"third attempt", 3, "", Decision{Phase: "terminal_failure", FailureCode: "native_session_retry_exhausted"}},
		{"replay conflict", 1, "native_event_replay_conflict", Decision{Phase: "terminal_failure", FailureCode: "native_event_replay_conflict"}},
		{"artifact incompatible", 1, "runner_remote_provider_artifact_incompatible", Decision{Phase: "terminal_failure", FailureCode: "runner_remote_provider_artifact_incompatible"}},
		// Beyond the seed: retryable causes still follow the attempt budget.
		{"retryable cause", 2, "provider_stdout_closed", Decision{Phase: "retryable_failure", FailureCode: "native_session_interrupted", NextAttemptAt: &next}},
		{"retryable cause exhausted", 4, "provider_stdout_closed", Decision{Phase: "terminal_failure", FailureCode: "native_session_retry_exhausted"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Disposition(tc.attempt, now, tc.source)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.want.Phase == PhaseRetryableFailure, got.Retry())
		})
	}
	short := DispositionWithDelay(1, now, "", 10*time.Millisecond)
	require.Equal(t, now.Add(10*time.Millisecond), *short.NextAttemptAt)
	require.Equal(t, 3, MaxAttempts)
	require.Equal(t, 30*time.Second, RetryDelay)
	require.False(t, Retryable("native_event_replay_conflict"))
	require.True(t, Retryable("provider_frame_too_large"))
}

func TestE11_EscalatesExhaustedResultlessSessionsToBoardReview(t *testing.T) {
	cases := []struct {
		name     string
		phase    string
		code     string
		want     Record
		wantJSON string
	}{
		{
			name: "retryable stays with the agent", phase: "retryable_failure", code: "native_session_interrupted",
			want: Record{
				Exhausted:                  false,
				IssueStatus:                "",
				RecoveryOwner:              Owner{Kind: "agent", AgentID: "agent-low-capability"},
				RecoveryActionOwnerType:    "agent",
				RecoveryActionOwnerAgentID: "agent-low-capability",
				RecoveryActionCause:        "native_session_interrupted",
				SupersedeOnIdentityChange:  true,
			},
			wantJSON: `{"exhausted":false,"recoveryOwner":{"kind":"agent","agentId":"agent-low-capability"},
				"recoveryActionOwnerType":"agent","recoveryActionOwnerAgentId":"agent-low-capability",
				"recoveryActionCause":"native_session_interrupted","supersedeOnIdentityChange":true}`,
		},
		{
			name: "exhausted goes to the board", phase: "terminal_failure", code: "native_session_retry_exhausted",
			want: Record{
				Exhausted:                  true,
				IssueStatus:                "in_review",
				RecoveryOwner:              Owner{Kind: "board"},
				RecoveryActionOwnerType:    "board",
				RecoveryActionOwnerAgentID: "",
				RecoveryActionCause:        "native_session_retry_exhausted",
				SupersedeOnIdentityChange:  true,
			},
			wantJSON: `{"exhausted":true,"issueStatus":"in_review","recoveryOwner":{"kind":"board"},
				"recoveryActionOwnerType":"board","recoveryActionCause":"native_session_retry_exhausted",
				"supersedeOnIdentityChange":true}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Projection(tc.phase, tc.code, "agent-low-capability")
			require.Equal(t, tc.want, got)
			raw, err := json.Marshal(got)
			require.NoError(t, err)
			require.JSONEq(t, tc.wantJSON, string(raw))
			var back Record
			require.NoError(t, json.Unmarshal(raw, &back))
			require.Equal(t, got, back)
		})
	}
}
