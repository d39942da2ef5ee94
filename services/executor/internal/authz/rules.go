// Package authz authenticates the executor's callers and authorizes every
// call of its public services before the handler runs (SPEC T1, T2).
//
// Each method of ExecutorService and GatewayRegistry has exactly one Rule
// in Rules: the role it needs and where the company it acts for comes from
// (the request, the stored run or interaction, the caller's own companies
// for lists, none for fleet administration). A method without a rule is
// refused. A run or interaction of a company the caller cannot read
// answers exactly as a missing one (NotFound), so a caller learns nothing
// about other companies' resources.
package authz

import (
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/pkg/tenancy"
)

// Scope is where a rule finds the company a call acts for.
type Scope int

// Scopes.
const (
	// ScopeRequest: the company named in the request (Rule.Company).
	ScopeRequest Scope = iota + 1
	// ScopeRun: the company of the stored run named by the request's
	// run_id; a run the caller cannot read is run_not_found.
	ScopeRun
	// ScopeInteraction: the company of the stored interaction named by
	// interaction_id; one the caller cannot read is interaction_not_found.
	ScopeInteraction
	// ScopeList: the caller's own companies (the handler lists only
	// those; an operator's list is unrestricted).
	ScopeList
	// ScopeFleet: fleet administration, no company: operators only.
	ScopeFleet
	// ScopeGateway: a runner gateway's registration: the runnergw service
	// identity (mTLS) or an operator; a caller without an identity that
	// carries a registration proof is left to the registry, which checks
	// it against the registration secret (SPEC T5).
	ScopeGateway
)

func (s Scope) String() string {
	return map[Scope]string{ScopeRequest: "request", ScopeRun: "run", ScopeInteraction: "interaction",
		ScopeList: "list", ScopeFleet: "fleet", ScopeGateway: "gateway"}[s]
}

// Rule is one method's authorization.
type Rule struct {
	// Need is the role required for the company.
	Need tenancy.Role
	// Scope says where the company comes from.
	Scope Scope
	// Company reads the company from the request (ScopeRequest).
	Company func(req any) string
}

func companyOfSubmit(req any) string {
	return req.(*executorv1.SubmitRunRequest).GetInput().GetBinding().GetCompanyId()
}

func companyField(req any) string {
	r, _ := req.(interface{ GetCompanyId() string })
	if r == nil {
		return ""
	}
	return r.GetCompanyId()
}

// Rules is the one rule of every public method, by full method name.
var Rules = map[string]Rule{
	executorv1.ExecutorService_SubmitRun_FullMethodName:             {Need: tenancy.Writer, Scope: ScopeRequest, Company: companyOfSubmit},
	executorv1.ExecutorService_GetRun_FullMethodName:                {Need: tenancy.Reader, Scope: ScopeRun},
	executorv1.ExecutorService_ListRuns_FullMethodName:              {Need: tenancy.Reader, Scope: ScopeList},
	executorv1.ExecutorService_WatchRun_FullMethodName:              {Need: tenancy.Reader, Scope: ScopeRun},
	executorv1.ExecutorService_CancelRun_FullMethodName:             {Need: tenancy.Writer, Scope: ScopeRun},
	executorv1.ExecutorService_GetSteeringState_FullMethodName:      {Need: tenancy.Reader, Scope: ScopeRun},
	executorv1.ExecutorService_SteerRun_FullMethodName:              {Need: tenancy.Writer, Scope: ScopeRun},
	executorv1.ExecutorService_ResolveRuntimeRequest_FullMethodName: {Need: tenancy.Writer, Scope: ScopeRun},
	executorv1.ExecutorService_CompleteToolCall_FullMethodName:      {Need: tenancy.Writer, Scope: ScopeRun},
	executorv1.ExecutorService_GetSession_FullMethodName:            {Need: tenancy.Reader, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_CloseSession_FullMethodName:          {Need: tenancy.Writer, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_ReplaceSession_FullMethodName:        {Need: tenancy.Operator, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_ListInteractions_FullMethodName:      {Need: tenancy.Reader, Scope: ScopeList},
	executorv1.ExecutorService_GetInteraction_FullMethodName:        {Need: tenancy.Reader, Scope: ScopeInteraction},
	executorv1.ExecutorService_AnswerInteraction_FullMethodName:     {Need: tenancy.Writer, Scope: ScopeInteraction},
	executorv1.ExecutorService_PutSecret_FullMethodName:             {Need: tenancy.Writer, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_ListSecrets_FullMethodName:           {Need: tenancy.Reader, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_DeleteSecret_FullMethodName:          {Need: tenancy.Writer, Scope: ScopeRequest, Company: companyField},
	executorv1.ExecutorService_DeleteRun_FullMethodName:             {Need: tenancy.Operator, Scope: ScopeRun},
	executorv1.ExecutorService_PurgeCompany_FullMethodName:          {Need: tenancy.Operator, Scope: ScopeFleet},
	executorv1.GatewayRegistry_RegisterGateway_FullMethodName:       {Need: tenancy.Operator, Scope: ScopeGateway},
	executorv1.GatewayRegistry_ListGateways_FullMethodName:          {Need: tenancy.Operator, Scope: ScopeFleet},
	executorv1.GatewayRegistry_DrainGateway_FullMethodName:          {Need: tenancy.Operator, Scope: ScopeFleet},
	executorv1.Companies_GetCompanyLimits_FullMethodName:            {Need: tenancy.Reader, Scope: ScopeRequest, Company: companyField},
	executorv1.Companies_SetCompanyLimits_FullMethodName:            {Need: tenancy.Operator, Scope: ScopeFleet},
	executorv1.Companies_GetCompanyUsage_FullMethodName:             {Need: tenancy.Reader, Scope: ScopeRequest, Company: companyField},
}

// Services are the public services Rules covers: a method of one of them
// without a rule is refused.
var Services = []string{executorv1.ExecutorService_ServiceDesc.ServiceName, executorv1.GatewayRegistry_ServiceDesc.ServiceName,
	executorv1.Companies_ServiceDesc.ServiceName}
