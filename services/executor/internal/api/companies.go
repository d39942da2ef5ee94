package api

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/quota"
	"github.com/tether-run/tether/services/executor/internal/store"
)

// Companies implements tether.executor.v1.Companies (SPEC Q1, Q2, Q4):
// company limits and usage. Authorization is authz's (SetCompanyLimits:
// fleet operators; the reads: readers of the company).
type Companies struct {
	executorv1.UnimplementedCompaniesServer
	Store *store.Store
}

// GetCompanyLimits returns the limits that apply to a company.
func (c *Companies) GetCompanyLimits(ctx context.Context, req *executorv1.GetCompanyLimitsRequest) (*executorv1.GetCompanyLimitsResponse, error) {
	l, err := c.Store.CompanyLimits(ctx, req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	return &executorv1.GetCompanyLimitsResponse{Limits: limitsProto(l)}, nil
}

// SetCompanyLimits stores a company's limits, audited.
func (c *Companies) SetCompanyLimits(ctx context.Context, req *executorv1.SetCompanyLimitsRequest) (*executorv1.SetCompanyLimitsResponse, error) {
	out, err := c.Store.SetCompanyLimits(ctx, limitsOf(req.GetLimits()), principalOf(ctx), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &executorv1.SetCompanyLimitsResponse{Limits: limitsProto(out)}, nil
}

// GetCompanyUsage returns what a company uses now.
func (c *Companies) GetCompanyUsage(ctx context.Context, req *executorv1.GetCompanyUsageRequest) (*executorv1.GetCompanyUsageResponse, error) {
	u, err := c.Store.CompanyUsage(ctx, req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	return &executorv1.GetCompanyUsageResponse{Usage: &executorv1.CompanyUsage{
		CompanyId: u.Company, RunningRuns: int64(u.RunningRuns), QueuedRuns: int64(u.QueuedRuns),
		WarmSessions: int64(u.WarmSessions), Limits: limitsProto(u.Limits),
		Month: u.Month.Format("2006-01"), SpendUsd: u.SpendUSD, BudgetState: quota.Budget(u.SpendUSD, u.Limits).String(),
		Refused: u.Refused,
	}}, nil
}

var budgetPolicies = map[executorv1.BudgetPolicy]string{
	executorv1.BudgetPolicy_BUDGET_POLICY_UNSPECIFIED: store.BudgetPolicyFinishTurn,
	executorv1.BudgetPolicy_BUDGET_POLICY_FINISH_TURN: store.BudgetPolicyFinishTurn,
	executorv1.BudgetPolicy_BUDGET_POLICY_CANCEL:      store.BudgetPolicyCancel,
}

// limitsOf decodes limits, with their defaults (weight 1, warn ratio 0.8,
// finish_turn).
func limitsOf(p *executorv1.CompanyLimits) store.CompanyLimits {
	l := store.CompanyLimits{Company: p.GetCompanyId(), Weight: int(p.GetWeight()), BudgetWarnRatio: p.GetBudgetWarnRatio(),
		BudgetPolicy: budgetPolicies[p.GetBudgetPolicy()], MonthlyBudgetUSD: p.MonthlyBudgetUsd}
	if l.Weight == 0 {
		l.Weight = 1
	}
	if l.BudgetWarnRatio == 0 {
		l.BudgetWarnRatio = 0.8
	}
	l.MaxRunningRuns, l.MaxWarmSessions, l.MaxQueuedRuns = optInt(p.MaxRunningRuns), optInt(p.MaxWarmSessions), optInt(p.MaxQueuedRuns)
	return l
}

func optInt(v *int32) *int {
	if v == nil {
		return nil
	}
	n := int(*v)
	return &n
}

func optInt32(v *int) *int32 {
	if v == nil {
		return nil
	}
	n := int32(*v)
	return &n
}

func limitsProto(l store.CompanyLimits) *executorv1.CompanyLimits {
	policy := executorv1.BudgetPolicy_BUDGET_POLICY_FINISH_TURN
	if l.BudgetPolicy == store.BudgetPolicyCancel {
		policy = executorv1.BudgetPolicy_BUDGET_POLICY_CANCEL
	}
	return &executorv1.CompanyLimits{CompanyId: l.Company, MaxRunningRuns: optInt32(l.MaxRunningRuns),
		MaxWarmSessions: optInt32(l.MaxWarmSessions), MaxQueuedRuns: optInt32(l.MaxQueuedRuns), Weight: int32(l.Weight),
		MonthlyBudgetUsd: l.MonthlyBudgetUSD, BudgetWarnRatio: l.BudgetWarnRatio, BudgetPolicy: policy,
		IsDefault: l.IsDefault, UpdatedAt: timestamppb.New(l.UpdatedAt), UpdatedBy: l.UpdatedBy}
}
