package api

import (
	"context"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	"github.com/tether-run/tether/services/executor/internal/retention"
)

// purgeBatchRuns bounds one transaction of PurgeCompany.
const purgeBatchRuns = 200

// DeleteRun deletes one ended run with what hangs off it (SPEC L1): the
// archives of the superseded checkpoints naming it first (the backup
// verifier owns them), then the rows, and the operator audit records who
// did it.
func (s *Server) DeleteRun(ctx context.Context, req *executorv1.DeleteRunRequest) (*executorv1.DeleteRunResponse, error) {
	r, err := s.resolve(ctx, req.GetRunId(), req.GetCompanyId())
	if err != nil {
		return nil, err
	}
	plan, err := s.Store.PlanDeleteRun(ctx, r.Key, req.GetRunId())
	if err != nil {
		return nil, err
	}
	if len(plan.Checkpoints) > 0 {
		if s.Checkpoints == nil {
			return nil, retention.ErrNoVerifier()
		}
		if err := s.Checkpoints.DeleteCheckpoints(ctx, plan.Checkpoints, nil); err != nil {
			return nil, err
		}
	}
	c, err := s.Store.DeleteRun(ctx, r.Key, req.GetRunId(), s.principal(ctx), req.GetReason())
	if err != nil {
		return nil, err
	}
	return &executorv1.DeleteRunResponse{RunId: req.GetRunId(), CompanyId: r.Company, Deleted: c.Proto()}, nil
}

// PurgeCompany deletes everything the executor keeps of a company (SPEC
// L1); fleet operators only (authz).
func (s *Server) PurgeCompany(ctx context.Context, req *executorv1.PurgeCompanyRequest) (*executorv1.PurgeCompanyResponse, error) {
	c, err := retention.PurgeCompany(ctx, s.Store, s.Checkpoints, req.GetCompanyId(), s.principal(ctx), req.GetReason(), purgeBatchRuns)
	if err != nil {
		return nil, err
	}
	return &executorv1.PurgeCompanyResponse{CompanyId: req.GetCompanyId(), Deleted: c.Proto()}, nil
}
