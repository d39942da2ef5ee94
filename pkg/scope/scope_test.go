package scope

import (
	"testing"

	"github.com/stretchr/testify/require"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"google.golang.org/protobuf/proto"
)

func input(company, session string) *prpv1.ExecutionInput {
	return &prpv1.ExecutionInput{
		Provider: &prpv1.Provider{Kind: "codex"},
		Binding:  &prpv1.Binding{CompanyId: company, AgentId: "agent-1", IssueId: "ISS-1"},
		Task:     &prpv1.Task{Prompt: "hi"},
		Session:  &prpv1.Session{NormalizedSessionId: session},
	}
}

func TestScopeExcludesRunAndIssueButSeparatesCompanies(t *testing.T) {
	a := input("acme", "s1")
	b := proto.Clone(a).(*prpv1.ExecutionInput)
	b.Binding.IssueId = "ISS-2"
	b.Task.Prompt = "other"
	require.Equal(t, Of(a), Of(b))
	require.NotEqual(t, Of(a), Of(input("globex", "s1")))
	require.NotEqual(t, Of(a), Of(input("acme", "s2")))
	require.Len(t, Of(a), 64)
}
