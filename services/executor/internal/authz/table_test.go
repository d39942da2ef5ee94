package authz_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/tenancy"
	"github.com/tether-run/tether/services/executor/internal/authz"
)

// acmeRequests builds, for every public method, a request acting on
// company acme's resources (caller names the caller, so that writes of
// different callers do not collide). A method missing here fails the table
// test, as does a method without a rule.
var acmeRequests = map[string]func(caller string, ia map[string]string) proto.Message{
	executorv1.ExecutorService_SubmitRun_FullMethodName: func(caller string, _ map[string]string) proto.Message {
		return &executorv1.SubmitRunRequest{RunId: "acme-submit-" + caller, Input: input("acme", "s-acme", "more "+acmeCanary)}
	},
	executorv1.ExecutorService_GetRun_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.GetRunRequest{RunId: "acme-run"}
	},
	executorv1.ExecutorService_ListRuns_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.ListRunsRequest{}
	},
	executorv1.ExecutorService_WatchRun_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.WatchRunRequest{RunId: "acme-run"}
	},
	executorv1.ExecutorService_CancelRun_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.CancelRunRequest{RunId: "acme-run", Scope: executorv1.CancellationScope_CANCELLATION_SCOPE_RUN}
	},
	executorv1.ExecutorService_GetSteeringState_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.GetSteeringStateRequest{RunId: "acme-run"}
	},
	executorv1.ExecutorService_SteerRun_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.SteerRunRequest{RunId: "acme-run", Message: "attacker steering text"}
	},
	executorv1.ExecutorService_ResolveRuntimeRequest_FullMethodName: func(string, map[string]string) proto.Message {
		res, _ := structpb.NewStruct(map[string]any{"decision": "accept"})
		return &executorv1.ResolveRuntimeRequestRequest{RunId: "acme-run", RequestId: "req-1", TurnId: "turn-1", Resolution: res}
	},
	executorv1.ExecutorService_CompleteToolCall_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.CompleteToolCallRequest{RunId: "acme-run", CallId: "call-1", Success: true, Text: "x"}
	},
	executorv1.ExecutorService_GetSession_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.GetSessionRequest{CompanyId: "acme", NormalizedSessionId: "s-acme"}
	},
	executorv1.ExecutorService_CloseSession_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.CloseSessionRequest{CompanyId: "acme", NormalizedSessionId: "s-acme"}
	},
	executorv1.ExecutorService_ReplaceSession_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.ReplaceSessionRequest{CompanyId: "acme", NormalizedSessionId: "s-acme", RequestedBy: "someone", Reason: "r"}
	},
	executorv1.ExecutorService_ListInteractions_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.ListInteractionsRequest{}
	},
	executorv1.ExecutorService_GetInteraction_FullMethodName: func(_ string, ia map[string]string) proto.Message {
		return &executorv1.GetInteractionRequest{InteractionId: ia["acme"]}
	},
	executorv1.ExecutorService_AnswerInteraction_FullMethodName: func(_ string, ia map[string]string) proto.Message {
		return &executorv1.AnswerInteractionRequest{InteractionId: ia["acme"],
			Answers: []*executorv1.InteractionAnswer{{QuestionId: "nope", OptionIds: []string{"nope"}}}}
	},
	executorv1.ExecutorService_PutSecret_FullMethodName: func(caller string, _ map[string]string) proto.Message {
		return &executorv1.PutSecretRequest{CompanyId: "acme", Name: "put-by-" + caller, Value: []byte(secretCanary)}
	},
	executorv1.ExecutorService_ListSecrets_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.ListSecretsRequest{CompanyId: "acme"}
	},
	executorv1.ExecutorService_DeleteSecret_FullMethodName: func(caller string, _ map[string]string) proto.Message {
		return &executorv1.DeleteSecretRequest{CompanyId: "acme", Name: "put-by-" + caller}
	},
	executorv1.GatewayRegistry_RegisterGateway_FullMethodName: func(caller string, _ map[string]string) proto.Message {
		return &executorv1.RegisterGatewayRequest{GatewayId: "gw-" + caller, Address: "127.0.0.1:1", Capacity: 1}
	},
	executorv1.GatewayRegistry_ListGateways_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.ListGatewaysRequest{}
	},
	executorv1.ExecutorService_DeleteRun_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.DeleteRunRequest{RunId: "acme-run", Reason: "table"}
	},
	executorv1.ExecutorService_PurgeCompany_FullMethodName: func(string, map[string]string) proto.Message {
		// A company without data: the table's later calls need acme's.
		return &executorv1.PurgeCompanyRequest{CompanyId: "acme-purged", Reason: "table"}
	},
	executorv1.GatewayRegistry_DrainGateway_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.DrainGatewayRequest{GatewayId: "gw-operator"}
	},
	executorv1.Companies_GetCompanyLimits_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.GetCompanyLimitsRequest{CompanyId: "acme"}
	},
	executorv1.Companies_SetCompanyLimits_FullMethodName: func(string, map[string]string) proto.Message {
		// Another company: the table's later submissions are acme's.
		return &executorv1.SetCompanyLimitsRequest{Limits: &executorv1.CompanyLimits{CompanyId: "acme-limited"}, Reason: "table"}
	},
	executorv1.Companies_GetCompanyUsage_FullMethodName: func(string, map[string]string) proto.Message {
		return &executorv1.GetCompanyUsageRequest{CompanyId: "acme"}
	},
}

type caller struct {
	name   string
	grants []string
	// foreign is the canary of a company whose data the caller must never
	// see ("" for the operator).
	foreign string
}

var callers = []caller{
	{name: "nobody", foreign: acmeCanary},
	{name: "globex-writer", grants: []string{"globex:writer"}, foreign: acmeCanary},
	{name: "acme-reader", grants: []string{"acme:reader"}, foreign: globexCanary},
	{name: "acme-writer", grants: []string{"acme:writer"}, foreign: globexCanary},
	{name: "operator", grants: []string{"operator"}},
}

// expect is the outcome the rule implies for a caller on acme's
// resources: admitted (the handler runs), or refused with a code and,
// for a stored resource of another company, the missing resource's reason.
func expect(c caller, rule authz.Rule) (admitted bool, code codes.Code, reason string) {
	if len(c.grants) == 0 {
		return false, codes.Unauthenticated, failure.CallerUnauthenticated
	}
	p, err := tenancy.ParseGrants(c.name, tenancy.SourceToken, c.grants)
	if err != nil {
		panic(err)
	}
	switch rule.Scope {
	case authz.ScopeRun, authz.ScopeInteraction:
		if !p.Can("acme", tenancy.Reader) {
			if rule.Scope == authz.ScopeRun {
				return false, codes.NotFound, failure.RunNotFound
			}
			return false, codes.NotFound, failure.InteractionNotFound
		}
		if !p.Can("acme", rule.Need) {
			return false, codes.PermissionDenied, failure.CallerNotAuthorized
		}
	case authz.ScopeRequest:
		if !p.Can("acme", rule.Need) {
			return false, codes.PermissionDenied, failure.CallerNotAuthorized
		}
	case authz.ScopeList:
		// Every principal holds a role somewhere: it lists its own.
	case authz.ScopeFleet, authz.ScopeGateway:
		if !p.Operator {
			return false, codes.PermissionDenied, failure.CallerNotAuthorized
		}
	}
	return true, codes.OK, ""
}

// TestT2_EveryMethodOfEveryPublicServiceHasOneRuleEnforcedForEveryCaller
// enumerates every method of ExecutorService and GatewayRegistry from the
// protobuf descriptors (a new method without a rule, or without a request
// here, fails it) and calls each over real gRPC as (a) no identity, (b)
// another company's writer, (c) the company's reader, (d) its writer and
// (e) an operator: the code is the rule's, a refused call never reaches
// the handler, and no response (nor error) carries another company's data.
func TestT2_EveryMethodOfEveryPublicServiceHasOneRuleEnforcedForEveryCaller(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	ia := e.seed(ctx, map[string]*grpc.ClientConn{"acme": e.as("seed-a", "acme:writer"), "globex": e.as("seed-g", "globex:writer")})
	conns := map[string]*grpc.ClientConn{}
	for _, c := range callers {
		conns[c.name] = e.as(c.name, c.grants...)
	}
	methods := 0
	for _, svc := range authz.Services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
		require.NoError(t, err)
		sd := d.(protoreflect.ServiceDescriptor)
		for i := 0; i < sd.Methods().Len(); i++ {
			md := sd.Methods().Get(i)
			full := "/" + svc + "/" + string(md.Name())
			methods++
			rule, ok := authz.Rules[full]
			require.True(t, ok, "%s has no authorization rule in authz.Rules", full)
			build, ok := acmeRequests[full]
			require.True(t, ok, "%s has no request in this table", full)
			for _, c := range callers {
				before := e.reachedCount(full)
				out, err := call(ctx, conns[c.name], md, full, build(c.name, ia))
				admitted, code, reason := expect(c, rule)
				got := e.reachedCount(full) > before
				require.Equal(t, admitted, got, "%s as %s: admitted (err %v)", full, c.name, err)
				if !admitted {
					require.Equal(t, code, status.Code(err), "%s as %s: %v", full, c.name, err)
					require.EqualValues(t, reason, failure.CodeOf(err), "%s as %s: %v", full, c.name, err)
				} else {
					require.NotContains(t, []codes.Code{codes.Unauthenticated, codes.PermissionDenied}, status.Code(err), "%s as %s: %v", full, c.name, err)
				}
				if c.foreign != "" {
					require.NotContains(t, out+status.Convert(err).String(), c.foreign, "%s as %s leaks another company's data", full, c.name)
				}
				require.NotContains(t, out+status.Convert(err).String(), secretCanary, "%s as %s returns a secret value", full, c.name)
			}
		}
	}
	require.Equal(t, len(authz.Rules), methods, "every rule names a public method")
}

// call invokes a method generically (unary or server streaming) and
// returns its responses as JSON text.
func call(ctx context.Context, conn *grpc.ClientConn, md protoreflect.MethodDescriptor, full string, req proto.Message) (string, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return "", err
	}
	if !md.IsStreamingServer() && !md.IsStreamingClient() {
		resp := mt.New().Interface()
		if err := conn.Invoke(ctx, full, req, resp); err != nil {
			return "", err
		}
		return protojson.Format(resp), nil
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, full)
	if err != nil {
		return "", err
	}
	if err := st.SendMsg(req); err != nil {
		return "", err
	}
	if err := st.CloseSend(); err != nil {
		return "", err
	}
	var out strings.Builder
	for {
		resp := mt.New().Interface()
		err := st.RecvMsg(resp)
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			return out.String(), err
		}
		out.WriteString(protojson.Format(resp))
	}
}
