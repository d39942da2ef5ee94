package authz_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/testing/pgtest"
	"github.com/tether-run/tether/services/executor/internal/authz"
)

// TestT3_NoResponseOfAnyMethodNorStoredRunCarriesASecretValue: acme's run
// names a secret and configures a plain value, both a canary. Every method
// of every public service, enumerated from the descriptors, is called as
// acme's writer and as an operator (who may read everything), and so is an
// answer that submits a continuation run: no response holds the canary.
// Neither does any stored run input (runs.input) nor any secret row in
// clear (they are sealed).
func TestT3_NoResponseOfAnyMethodNorStoredRunCarriesASecretValue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	ia := e.seed(ctx, map[string]*grpc.ClientConn{"acme": e.as("seed-a", "acme:writer"), "globex": e.as("seed-g", "globex:writer")})
	callers := map[string]*grpc.ClientConn{"acme-writer": e.as("w", "acme:writer"), "operator": e.as("op", "operator")}
	scan := func(what, out string) {
		require.NotContains(t, out, secretCanary, "%s returns a secret value", what)
	}
	methods := 0
	for _, svc := range authz.Services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		require.NoError(t, err)
		sd := d.(protoreflect.ServiceDescriptor)
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			full := "/" + svc + "/" + string(md.Name())
			build, ok := acmeRequests[full]
			require.True(t, ok, "%s has no request in the table", full)
			methods++
			if full == executorv1.ExecutorService_DeleteRun_FullMethodName || full == executorv1.ExecutorService_PurgeCompany_FullMethodName {
				continue // they answer counts, and would delete what the rest of this test reads
			}
			for name, conn := range callers {
				out, err := call(ctx, conn, md, full, build(name, ia))
				scan(full+" as "+name, out+status.Convert(err).String())
			}
		}
	}
	require.Greater(t, methods, 20)

	// An answer that submits the continuation run: it returns the run,
	// whose input is the source run's.
	c := executorv1.NewExecutorServiceClient(callers["acme-writer"])
	ans, err := c.AnswerInteraction(ctx, &executorv1.AnswerInteractionRequest{InteractionId: ia["acme"],
		Answers: []*executorv1.InteractionAnswer{{QuestionId: "q", OptionIds: []string{"o"}}}})
	require.NoError(t, err)
	require.NotNil(t, ans.GetContinuationRun())
	require.NotEmpty(t, ans.GetContinuationRun().GetInput().GetEnvironment().GetSecretRefs(), "the continuation names the same secrets")
	scan("AnswerInteraction", protojson.Format(ans))
	for _, id := range []string{"acme-run", ans.GetContinuationRun().GetRunId()} {
		got, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: id})
		require.NoError(t, err)
		scan("GetRun "+id, protojson.Format(got))
	}

	// At rest: no table holds a value in clear (runs.input names the
	// secrets; the secrets are sealed). The search finds what is there:
	// acme's prompt, in runs.input.
	found, err := pgtest.FindInDatabase(ctx, e.store.Pool(), acmeCanary, "executor")
	require.NoError(t, err)
	require.Contains(t, found, "executor.runs.input")
	for _, c := range []string{secretCanary, secretCanary + "-plain"} {
		found, err := pgtest.FindInDatabase(ctx, e.store.Pool(), c, "executor")
		require.NoError(t, err)
		require.Empty(t, found, "a secret value is stored in clear")
	}
	var rows int
	require.NoError(t, e.store.Pool().QueryRow(ctx, `SELECT count(*) FROM executor.secrets WHERE company_id = 'acme'`).Scan(&rows))
	require.Equal(t, 2, rows, "acme's named secret and its plain configured value, stored by reference")
}

// TestT3_SecretsAreWrittenAndRotatedByTheCompanysWritersOnly: acme's
// writer puts a secret and rotates it (versions 1, 2; the run's
// resolution gets the new value); acme's reader lists names and versions
// but cannot write; globex's writer can neither list, write, rotate nor
// delete acme's secrets; the principal that wrote each version is
// recorded; a deleted secret is secret_not_found for the runs naming it.
func TestT3_SecretsAreWrittenAndRotatedByTheCompanysWritersOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	writer := executorv1.NewExecutorServiceClient(e.as("alice", "acme:writer"))
	reader := executorv1.NewExecutorServiceClient(e.as("bob", "acme:reader"))
	mallory := executorv1.NewExecutorServiceClient(e.as("mallory", "globex:writer"))

	put, err := writer.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte("v1-" + secretCanary)})
	require.NoError(t, err)
	require.EqualValues(t, 1, put.GetSecret().GetVersion())
	require.Contains(t, put.GetSecret().GetUpdatedBy(), "alice")
	refs := map[string]string{"OPENAI_API_KEY": "openai"}
	vals, err := e.vault.Resolve(ctx, "acme", refs)
	require.NoError(t, err)
	require.Equal(t, "v1-"+secretCanary, vals["OPENAI_API_KEY"])

	put, err = writer.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte("v2-" + secretCanary)})
	require.NoError(t, err)
	require.EqualValues(t, 2, put.GetSecret().GetVersion(), "a put of an existing name rotates it")
	vals, err = e.vault.Resolve(ctx, "acme", refs)
	require.NoError(t, err)
	require.Equal(t, "v2-"+secretCanary, vals["OPENAI_API_KEY"], "an attempt after the rotation gets the new value")
	_, err = e.vault.Resolve(ctx, "globex", refs)
	require.EqualValues(t, failure.SecretNotFound, failure.CodeOf(err), "another company's run never resolves acme's secret: %v", err)

	list, err := reader.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "acme"})
	require.NoError(t, err)
	require.Len(t, list.GetSecrets(), 1)
	require.Equal(t, "openai", list.GetSecrets()[0].GetName())
	require.EqualValues(t, 2, list.GetSecrets()[0].GetVersion())
	require.NotContains(t, protojson.Format(list), secretCanary)
	_, err = reader.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte("reader")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	_, err = mallory.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "acme"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = mallory.PutSecret(ctx, &executorv1.PutSecretRequest{CompanyId: "acme", Name: "openai", Value: []byte("attacker")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	_, err = mallory.DeleteSecret(ctx, &executorv1.DeleteSecretRequest{CompanyId: "acme", Name: "openai"})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	own, err := mallory.ListSecrets(ctx, &executorv1.ListSecretsRequest{CompanyId: "globex"})
	require.NoError(t, err)
	require.Empty(t, own.GetSecrets(), "companies' secrets are apart")

	del, err := writer.DeleteSecret(ctx, &executorv1.DeleteSecretRequest{CompanyId: "acme", Name: "openai"})
	require.NoError(t, err)
	require.EqualValues(t, 2, del.GetSecret().GetVersion())
	_, err = writer.DeleteSecret(ctx, &executorv1.DeleteSecretRequest{CompanyId: "acme", Name: "openai"})
	require.Equal(t, codes.NotFound, status.Code(err))
	_, err = e.vault.Resolve(ctx, "acme", refs)
	require.EqualValues(t, failure.SecretNotFound, failure.CodeOf(err), "%v", err)
}
