package api

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/services/executor/internal/authz"
)

// PutSecret stores a new version of a company secret (SPEC T3); the
// response names the version, never the value.
func (s *Server) PutSecret(ctx context.Context, req *executorv1.PutSecretRequest) (*executorv1.PutSecretResponse, error) {
	if err := s.vaultReady(); err != nil {
		return nil, err
	}
	sealed, err := s.Vault.Keys.Seal(req.GetCompanyId(), req.GetName(), req.GetValue())
	if err != nil {
		return nil, err
	}
	sec, err := s.Store.PutSecret(ctx, req.GetCompanyId(), req.GetName(), s.principal(ctx), sealed)
	if err != nil {
		return nil, err
	}
	return &executorv1.PutSecretResponse{Secret: sec}, nil
}

// ListSecrets lists a company's secrets: names and versions.
func (s *Server) ListSecrets(ctx context.Context, req *executorv1.ListSecretsRequest) (*executorv1.ListSecretsResponse, error) {
	list, next, err := s.Store.ListSecrets(ctx, req.GetCompanyId(), int(req.GetPageSize()), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &executorv1.ListSecretsResponse{Secrets: list, NextPageToken: next}, nil
}

// DeleteSecret deletes a company's secret.
func (s *Server) DeleteSecret(ctx context.Context, req *executorv1.DeleteSecretRequest) (*executorv1.DeleteSecretResponse, error) {
	sec, err := s.Store.DeleteSecret(ctx, req.GetCompanyId(), req.GetName())
	if err != nil {
		return nil, err
	}
	return &executorv1.DeleteSecretResponse{Secret: sec}, nil
}

func (s *Server) vaultReady() error {
	if s.Vault == nil {
		return failure.New(codes.FailedPrecondition, failure.SecretUnreadable, "this executor keeps no secrets (no -secrets-key-file)")
	}
	return nil
}

// principal names the caller in what the executor records for it: the
// authenticated principal; in loopback development mode (no identities)
// its peer ("dev:<peer>").
func (s *Server) principal(ctx context.Context) string { return principalOf(ctx) }

// principalOf is the caller's principal as the audits name it.
func principalOf(ctx context.Context) string {
	return authz.Actor(ctx, "dev:"+grpcx.PeerIdentity(ctx))
}

// byReference stores a submitted input's plain configured environment
// values as company secrets and returns the input naming them (SPEC T3: a
// run never carries a value; the migration path of environment.configured).
func (s *Server) byReference(ctx context.Context, in *prpv1.ExecutionInput) (*prpv1.ExecutionInput, error) {
	if len(in.GetEnvironment().GetConfigured()) == 0 {
		return in, nil
	}
	if err := s.vaultReady(); err != nil {
		return nil, err
	}
	return s.Vault.ByReference(ctx, s.principal(ctx), in)
}
