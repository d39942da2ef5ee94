package authz_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/authz"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// sharedRunID is the run id both acme and globex submit.
const sharedRunID = "shared-run"

var canaries = map[string]string{"acme": acmeCanary, "globex": globexCanary}

// seedShared has acme and globex each submit a run of id sharedRunID (the
// same id, each its own input), each with an interaction, and returns the
// runs' internal keys by company.
func seedShared(t *testing.T, e *env) map[string]string {
	t.Helper()
	ctx := context.Background()
	keys := map[string]string{}
	for _, company := range []string{"acme", "globex"} {
		c := executorv1.NewExecutorServiceClient(e.as("seed-"+company, company+":writer"))
		resp, err := c.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: sharedRunID,
			Input: input(company, "s-shared-"+company, "shared "+canaries[company])})
		require.NoError(t, err, company)
		require.True(t, resp.GetCreated(), "%s's run %q is a run of its own", company, sharedRunID)
		require.Equal(t, sharedRunID, resp.GetRun().GetRunId(), "the response names the run as its company does")
		r, err := e.store.ResolveRun(ctx, store.RunRef{ID: sharedRunID, Company: company})
		require.NoError(t, err)
		keys[company] = r.Key
		_, err = e.store.Pool().Exec(ctx, `INSERT INTO executor.interactions (interaction_id, idempotency_key, kind, source_run_id, company_id, title, continuation_policy, payload)
VALUES ($1, $1, 'ask_user_questions', $2, $3, $4, 'response_wake', '{"questions":[{"id":"q","prompt":"p","options":[{"id":"o","label":"l"}]}]}')`,
			"ia-shared-"+company, r.Key, company, "shared question "+canaries[company])
		require.NoError(t, err)
	}
	require.NotEqual(t, keys["acme"], keys["globex"], "two runs, two internal keys")
	return keys
}

// TestT2_TwoCompaniesSubmitTheSameRunIDAndEachSeesOnlyItsOwn: run ids are
// unique per company. acme and globex both submit run id "shared-run":
// both are created, and every method whose request names a run (found
// from the descriptors: a new one is covered too), called by each
// company's reader and writer with that id, acts on the caller's own run:
// a writer's cancellation cancels its company's run only, reads return
// its own input, events and interactions, and no response or error holds
// the other company's data. The other company's run is never "not found"
// for its own callers, nor refused as a conflict.
func TestT2_TwoCompaniesSubmitTheSameRunIDAndEachSeesOnlyItsOwn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	keys := seedShared(t, e)
	client := func(name, grant string) executorv1.ExecutorServiceClient {
		return executorv1.NewExecutorServiceClient(e.as(name, grant))
	}
	// Within a company, idempotency and conflicts are as before.
	acmeW := client("aw", "acme:writer")
	again, err := acmeW.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: sharedRunID, Input: input("acme", "s-shared-acme", "shared "+acmeCanary)})
	require.NoError(t, err)
	require.False(t, again.GetCreated())
	require.Equal(t, sharedRunID, again.GetRun().GetRunId())
	globexW := client("gw", "globex:writer")
	again, err = globexW.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: sharedRunID, Input: input("globex", "s-shared-globex", "shared "+globexCanary)})
	require.NoError(t, err, "globex's resubmission finds its own run, whose key is not its id")
	require.False(t, again.GetCreated())
	require.Equal(t, sharedRunID, again.GetRun().GetRunId())
	require.Equal(t, "globex", again.GetRun().GetInput().GetBinding().GetCompanyId())
	_, err = globexW.SubmitRun(ctx, &executorv1.SubmitRunRequest{RunId: sharedRunID, Input: input("globex", "s-shared-globex", "other")})
	require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
	require.EqualValues(t, failure.RunIDConflict, failure.CodeOf(err))

	// acme's writer cancels its run: globex's run of the same id stays
	// queued.
	_, err = acmeW.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: sharedRunID, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	require.NoError(t, err)
	for company, want := range map[string]executorv1.RunState{"acme": executorv1.RunState_RUN_STATE_CANCELLED, "globex": executorv1.RunState_RUN_STATE_QUEUED} {
		run, err := e.store.GetRun(ctx, keys[company])
		require.NoError(t, err)
		require.Equal(t, want, run.GetState(), company)
	}
	_, err = globexW.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: sharedRunID, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	require.NoError(t, err)

	reached := 0
	for _, svc := range authz.Services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		require.NoError(t, err)
		sd := d.(protoreflect.ServiceDescriptor)
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			full := "/" + svc + "/" + string(md.Name())
			rule := authz.Rules[full]
			if md.Input().Fields().ByName("run_id") == nil || rule.Scope == authz.ScopeRequest {
				continue // not addressed by a stored run (SubmitRun: above)
			}
			for _, company := range []string{"acme", "globex"} {
				other := map[string]string{"acme": "globex", "globex": "acme"}[company]
				for _, role := range []string{"reader", "writer"} {
					conn := e.as(company+"-"+role, company+":"+role)
					req := sharedRequest(t, full, acmeRequests[full]("x", nil))
					before := e.reachedCount(full)
					out, err := call(ctx, conn, md, full, req)
					text := out + status.Convert(err).String()
					require.NotContains(t, text, canaries[other], "%s as %s's %s shows %s's run", full, company, role, other)
					if keys[other] != sharedRunID {
						require.NotContains(t, text, keys[other], "%s as %s's %s names %s's run key", full, company, role, other)
					}
					if (rule.Need == "writer" && role == "reader") || rule.Need == tenancy.Operator {
						require.Equal(t, codes.PermissionDenied, status.Code(err), "%s as %s's reader: %v", full, company, err)
						continue
					}
					require.Greater(t, e.reachedCount(full), before, "%s as %s's %s: %v", full, company, role, err)
					require.NotEqual(t, codes.NotFound, status.Code(err), "%s as %s's %s: its own run is found: %v", full, company, role, err)
					reached++
					switch full {
					case executorv1.ExecutorService_GetRun_FullMethodName, executorv1.ExecutorService_WatchRun_FullMethodName,
						executorv1.ExecutorService_CancelRun_FullMethodName, executorv1.ExecutorService_ListInteractions_FullMethodName:
						require.NoError(t, err, full)
						require.Contains(t, out, ownMark(full, company), "%s as %s's %s", full, company, role)
						if keys[company] != sharedRunID {
							require.NotContains(t, out, keys[company], "%s names the run by its id, not its key", full)
						}
					}
				}
			}
		}
	}
	require.NotZero(t, reached)

	// GetRun and WatchRun name the run as its company does.
	for _, company := range []string{"acme", "globex"} {
		c := client(company+"-r", company+":reader")
		run, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID})
		require.NoError(t, err)
		require.Equal(t, company, run.GetRun().GetInput().GetBinding().GetCompanyId())
		require.Equal(t, sharedRunID, run.GetRun().GetRunId())
		require.Equal(t, sharedRunID, run.GetRun().GetCancellation().GetRunId())
		w, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: sharedRunID})
		require.NoError(t, err)
		n := 0
		for {
			m, err := w.Recv()
			if err != nil {
				break
			}
			n++
			require.Equal(t, sharedRunID, m.GetEvent().GetRunId(), "%s's events name the run by its id", company)
		}
		require.NotZero(t, n)
		list, err := c.ListRuns(ctx, &executorv1.ListRunsRequest{})
		require.NoError(t, err)
		require.Len(t, list.GetRuns(), 1)
		require.Equal(t, sharedRunID, list.GetRuns()[0].GetRunId())
	}
}

// sharedRequest is the table's request for method full, addressed to
// sharedRunID.
func sharedRequest(t *testing.T, full string, req proto.Message) proto.Message {
	t.Helper()
	req = proto.Clone(req)
	f := req.ProtoReflect().Descriptor().Fields().ByName("run_id")
	require.NotNil(t, f, full)
	req.ProtoReflect().Set(f, protoreflect.ValueOfString(sharedRunID))
	return req
}

// ownMark is what a response of method full to company's caller must
// hold: its canary (a read of the run or its interactions), its company
// (a cancellation record) or the run's id (its events).
func ownMark(full, company string) string {
	switch full {
	case executorv1.ExecutorService_CancelRun_FullMethodName:
		return `"` + company + `"`
	case executorv1.ExecutorService_WatchRun_FullMethodName:
		return `"` + sharedRunID + `"`
	}
	return canaries[company]
}

// TestT2_AnOperatorNamingARunIDTwoCompaniesUseMustNameTheCompany: a caller
// that can read more than one company (an operator, a principal with
// roles in both, loopback development mode) and names a run id more than
// one of them uses is refused with FailedPrecondition run_id_ambiguous
// (never silently given one of the runs); with company_id it gets that
// company's run. company_id never widens a caller's reach: a company it
// cannot read answers as a missing run. An id only one company uses needs
// no company_id.
func TestT2_AnOperatorNamingARunIDTwoCompaniesUseMustNameTheCompany(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	seedShared(t, e)
	seedBoth(t, e)
	ambiguous := func(err error, who string) {
		t.Helper()
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%s: %v", who, err)
		require.EqualValues(t, failure.RunIDAmbiguous, failure.CodeOf(err), who)
	}
	for who, grants := range map[string][]string{"operator": {"operator"}, "both-reader": {"acme:reader", "globex:reader"}} {
		c := executorv1.NewExecutorServiceClient(e.as(who, grants...))
		_, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID})
		ambiguous(err, who)
		w, err := c.WatchRun(ctx, &executorv1.WatchRunRequest{RunId: sharedRunID})
		if err == nil {
			_, err = w.Recv()
		}
		ambiguous(err, who+" WatchRun")
		_, err = c.GetSteeringState(ctx, &executorv1.GetSteeringStateRequest{RunId: sharedRunID})
		ambiguous(err, who+" GetSteeringState")
		for _, company := range []string{"acme", "globex"} {
			run, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: company})
			require.NoError(t, err, who)
			require.Equal(t, company, run.GetRun().GetInput().GetBinding().GetCompanyId(), who)
			require.Equal(t, sharedRunID, run.GetRun().GetRunId())
		}
		_, err = c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: "initech"})
		require.Equal(t, codes.NotFound, status.Code(err), "%s: %v", who, err)
		run, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: "acme-run"})
		require.NoError(t, err, "%s: an id one company uses needs no company_id", who)
		require.Equal(t, "acme", run.GetRun().GetInput().GetBinding().GetCompanyId())
	}
	operator := executorv1.NewExecutorServiceClient(e.as("operator", "operator"))
	_, err := operator.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: sharedRunID, Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	ambiguous(err, "operator CancelRun")
	cancelled, err := operator.CancelRun(ctx, &executorv1.CancelRunRequest{RunId: sharedRunID, CompanyId: "globex", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN})
	require.NoError(t, err)
	require.Equal(t, "globex", cancelled.GetCancellation().GetCompanyId())
	require.Equal(t, sharedRunID, cancelled.GetCancellation().GetRunId())
	acme, err := operator.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: "acme"})
	require.NoError(t, err)
	require.Equal(t, executorv1.RunState_RUN_STATE_QUEUED, acme.GetRun().GetState(), "only globex's run was cancelled")

	// A caller of one company: company_id names its own company or none.
	globex := executorv1.NewExecutorServiceClient(e.as("gwen", "globex:writer"))
	for _, company := range []string{"", "globex"} {
		run, err := globex.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: company})
		require.NoError(t, err)
		require.Equal(t, "globex", run.GetRun().GetInput().GetBinding().GetCompanyId())
	}
	_, err = globex.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: "acme"})
	_, missing := globex.GetRun(ctx, &executorv1.GetRunRequest{RunId: "no-such-run", CompanyId: "acme"})
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	require.Equal(t, strings.ReplaceAll(status.Convert(missing).Message(), "no-such-run", sharedRunID), status.Convert(err).Message(),
		"another company's run answers exactly as a missing one")

	// Loopback development mode: every company is readable, so the same
	// rule holds.
	dev := newEnv(t, envOpts{noAuth: true})
	seedShared(t, dev)
	c := executorv1.NewExecutorServiceClient(dev.dial())
	_, err = c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID})
	ambiguous(err, "development mode")
	run, err := c.GetRun(ctx, &executorv1.GetRunRequest{RunId: sharedRunID, CompanyId: "globex"})
	require.NoError(t, err)
	require.Equal(t, "globex", run.GetRun().GetInput().GetBinding().GetCompanyId())
	list, err := c.ListInteractions(ctx, &executorv1.ListInteractionsRequest{RunId: sharedRunID})
	require.NoError(t, err)
	require.Len(t, list.GetInteractions(), 2, "a list shows the id's interactions of every company it may read")
	for _, ia := range list.GetInteractions() {
		require.Equal(t, sharedRunID, ia.GetSourceRunId())
	}
}
