package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// tetherctl -h (and a command's -h) prints the usage and exits 0; an
// unknown command still fails.
func TestD3_HelpExitsZero(t *testing.T) {
	var w bytes.Buffer
	for _, args := range [][]string{{"-h"}, {"--help"}, {"submit", "-h"}, {"watch", "-h"}, {"audit", "-h"}} {
		require.Equal(t, 0, exitCode(run(args), &w), "%v", args)
	}
	require.Equal(t, 1, exitCode(run([]string{"no-such-command"}), &w))
	require.Contains(t, w.String(), `unknown command "no-such-command"`)
}

// list shows each run's company: equal session ids of two companies are
// two sessions.
func TestD3_ListShowsTheCompany(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, printRuns(&out, []*executorv1.Run{
		{RunId: "r1", State: executorv1.RunState_RUN_STATE_SUCCEEDED, Attempt: 1, Input: &prpv1.ExecutionInput{
			Binding: &prpv1.Binding{CompanyId: "acme"}, Session: &prpv1.Session{NormalizedSessionId: "s1"}}},
		{RunId: "r2", State: executorv1.RunState_RUN_STATE_QUEUED, Input: &prpv1.ExecutionInput{
			Binding: &prpv1.Binding{CompanyId: "globex"}, Session: &prpv1.Session{NormalizedSessionId: "s1"}}},
	}))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3)
	require.Equal(t, []string{"RUN", "STATE", "COMPANY", "SESSION", "ATTEMPT", "EVENTS", "CREATED", "FAILURE"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"r1", "succeeded", "acme", "s1"}, strings.Fields(lines[1])[:4])
	require.Equal(t, []string{"r2", "queued", "globex", "s1"}, strings.Fields(lines[2])[:4])
}
