package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// companies is the Companies client of a command (SPEC Q1, Q2, Q4).
func (c *ctl) companies() executorv1.CompaniesClient { return executorv1.NewCompaniesClient(c.conn) }

// optLimit is a limit flag: a number, or "none" (no limit).
type optLimit struct{ v **int32 }

func (o optLimit) String() string {
	if o.v == nil || *o.v == nil {
		return "none"
	}
	return strconv.Itoa(int(**o.v))
}

func (o optLimit) Set(s string) error {
	if s == "none" || s == "" {
		*o.v = nil
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return fmt.Errorf("want a count of 0 or more, or none")
	}
	v := int32(n)
	*o.v = &v
	return nil
}

// budgetFlag is -monthly-budget-usd: USD, or "none".
type budgetFlag struct{ v **float64 }

func (b budgetFlag) String() string {
	if b.v == nil || *b.v == nil {
		return "none"
	}
	return strconv.FormatFloat(**b.v, 'f', -1, 64)
}

func (b budgetFlag) Set(s string) error {
	if s == "none" || s == "" {
		*b.v = nil
		return nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return fmt.Errorf("want USD of 0 or more, or none")
	}
	*b.v = &f
	return nil
}

// companiesLimitsSetCmd is `tetherctl companies limits set`: a company's
// limits (fleet operator; audited). Flags not given keep the company's
// current values (read first).
func companiesLimitsSetCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("companies limits set")
	company := companyFlag(fs, `the company, or "*" for the default of every company without its own`)
	reason := fs.String("reason", "", "why, kept in the operator audit")
	out := outputFlag(fs)
	var n executorv1.CompanyLimits
	fs.Var(optLimit{&n.MaxRunningRuns}, "max-running-runs", "runs in flight at once (a number or none)")
	fs.Var(optLimit{&n.MaxWarmSessions}, "max-warm-sessions", "warm sessions open at once (a number or none)")
	fs.Var(optLimit{&n.MaxQueuedRuns}, "max-queued-runs", "runs waiting to start (a number or none)")
	weight := fs.Int("weight", 1, "share of free slots against other companies (1..1000)")
	fs.Var(budgetFlag{&n.MonthlyBudgetUsd}, "monthly-budget-usd", "settled USD per calendar month, UTC (or none)")
	ratio := fs.Float64("budget-warn-ratio", 0.8, "fraction of the budget at which budget.warning is recorded")
	policy := fs.String("budget-policy", "finish_turn", "what runs in flight do at the hard limit: finish_turn or cancel")
	if err := fs.Parse(args); err != nil {
		return err
	}
	comp, err := c.requireCompany("companies limits set", *company)
	if err != nil {
		return err
	}
	p, ok := executorv1.BudgetPolicy_value["BUDGET_POLICY_"+strings.ToUpper(*policy)]
	if !ok {
		return fmt.Errorf("-budget-policy %q: want finish_turn or cancel", *policy)
	}
	cur, err := c.companies().GetCompanyLimits(ctx, &executorv1.GetCompanyLimitsRequest{CompanyId: comp})
	if err != nil {
		return err
	}
	l := cur.GetLimits()
	if l.GetIsDefault() && comp != "*" {
		// A company's first row starts from no limits, not the default's.
		l = &executorv1.CompanyLimits{Weight: 1, BudgetWarnRatio: 0.8}
	}
	l.CompanyId, l.IsDefault, l.UpdatedAt, l.UpdatedBy = comp, false, nil, ""
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "max-running-runs":
			l.MaxRunningRuns = n.MaxRunningRuns
		case "max-warm-sessions":
			l.MaxWarmSessions = n.MaxWarmSessions
		case "max-queued-runs":
			l.MaxQueuedRuns = n.MaxQueuedRuns
		case "weight":
			l.Weight = int32(*weight)
		case "monthly-budget-usd":
			l.MonthlyBudgetUsd = n.MonthlyBudgetUsd
		case "budget-warn-ratio":
			l.BudgetWarnRatio = *ratio
		case "budget-policy":
			l.BudgetPolicy = executorv1.BudgetPolicy(p)
		}
	})
	resp, err := c.companies().SetCompanyLimits(ctx, &executorv1.SetCompanyLimitsRequest{Limits: l, Reason: *reason})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error { renderLimits(c.out, resp.GetLimits()); return nil })
}

// companiesLimitsGetCmd is `tetherctl companies limits get`.
func companiesLimitsGetCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("companies limits get")
	company := companyFlag(fs, `the company, or "*" for the default`)
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	comp, err := c.requireCompany("companies limits get", *company)
	if err != nil {
		return err
	}
	resp, err := c.companies().GetCompanyLimits(ctx, &executorv1.GetCompanyLimitsRequest{CompanyId: comp})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error { renderLimits(c.out, resp.GetLimits()); return nil })
}

// companiesUsageCmd is `tetherctl companies usage`.
func companiesUsageCmd(ctx context.Context, c *ctl, args []string) error {
	fs := newFlagSet("companies usage")
	company := companyFlag(fs, "the company")
	out := outputFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	comp, err := c.requireCompany("companies usage", *company)
	if err != nil {
		return err
	}
	resp, err := c.companies().GetCompanyUsage(ctx, &executorv1.GetCompanyUsageRequest{CompanyId: comp})
	if err != nil {
		return err
	}
	return emit(c.out, out, resp, func() error {
		u := resp.GetUsage()
		l := u.GetLimits()
		fmt.Fprintf(c.out, "company %s\n", u.GetCompanyId())
		fmt.Fprintf(c.out, "running        %d / %s\n", u.GetRunningRuns(), limitText(l.MaxRunningRuns))
		fmt.Fprintf(c.out, "queued         %d / %s\n", u.GetQueuedRuns(), limitText(l.MaxQueuedRuns))
		fmt.Fprintf(c.out, "warm sessions  %d / %s\n", u.GetWarmSessions(), limitText(l.MaxWarmSessions))
		if u.GetMonth() != "" {
			fmt.Fprintf(c.out, "spend %s     %.6f / %s USD (%s)\n", u.GetMonth(), u.GetSpendUsd(), budgetFlag{&l.MonthlyBudgetUsd}.String(), u.GetBudgetState())
		}
		reasons := make([]string, 0, len(u.GetRefused()))
		for r := range u.GetRefused() {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Fprintf(c.out, "refused        %d %s\n", u.GetRefused()[r], r)
		}
		return nil
	})
}

func limitText(v *int32) string { return optLimit{&v}.String() }

// renderLimits prints a company's limits.
func renderLimits(w io.Writer, l *executorv1.CompanyLimits) {
	company := l.GetCompanyId()
	if l.GetIsDefault() {
		company += " (the default's)"
	}
	fmt.Fprintf(w, "company            %s\n", company)
	fmt.Fprintf(w, "max running runs   %s\n", limitText(l.MaxRunningRuns))
	fmt.Fprintf(w, "max warm sessions  %s\n", limitText(l.MaxWarmSessions))
	fmt.Fprintf(w, "max queued runs    %s\n", limitText(l.MaxQueuedRuns))
	fmt.Fprintf(w, "weight             %d\n", l.GetWeight())
	fmt.Fprintf(w, "monthly budget     %s USD, warning at %.0f%%, policy %s\n", budgetFlag{&l.MonthlyBudgetUsd}.String(),
		100*l.GetBudgetWarnRatio(), strings.ToLower(strings.TrimPrefix(l.GetBudgetPolicy().String(), "BUDGET_POLICY_")))
	fmt.Fprintf(w, "updated            %s by %s\n", l.GetUpdatedAt().AsTime().Format("2006-01-02 15:04:05Z07:00"), l.GetUpdatedBy())
}
