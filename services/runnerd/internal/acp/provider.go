package acp

import (
	"context"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/provider"
)

// StartProvider is runnerd's provider.StartFunc for the ACPX agents
// (SPEC R11, launch profiles acpx-codex and acpx-claude). The agent, its
// homes and the driver's durable state live under the scope root's acpx/
// (SPEC B2); the operator's home template (launch-only credentials and
// configuration, e.g. codex's config.toml) is copied into the agent's home
// before every start. The agent is runnerd's direct child in its own process group,
// not hosted: after a runnerd crash there is nothing to re-attach to, so a
// re-attach is refused as provider_process_lost (the runner then kills
// what is left of the old group and loads the session in a new process).
func StartProvider(ctx context.Context, cfg provider.Config, emit func(provider.Event)) (provider.Provider, error) {
	if cfg.Reattach {
		return nil, &provider.Error{Code: failure.ProviderProcessLost, Message: "an ACP agent does not survive its runnerd (it is not hosted); the session is loaded in a new process"}
	}
	dir := filepath.Join(cfg.StateDir, "acpx")
	if err := MakeHomes(dir, cfg.Agent); err != nil {
		return nil, &provider.Error{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	if err := CopyTemplate(cfg.HomeTemplate, dir, cfg.Agent); err != nil {
		return nil, &provider.Error{Code: failure.ProviderConfigInvalid, Message: err.Error()}
	}
	s, err := Start(ctx, Config{
		Command: cfg.Command, Args: cfg.Args, Env: Environment(cfg.Env, dir, cfg.Agent, os.Geteuid() == 0),
		Dir: cfg.Dir, StateDir: dir, Agent: cfg.Agent, PermissionMode: cfg.PermissionMode, Model: cfg.Model,
		StartupTimeout: cfg.StartupTimeout, RequestTimeout: cfg.RequestTimeout, Logger: cfg.Logger,
	}, emit)
	if err != nil {
		return nil, err
	}
	return s, nil
}

var (
	_ provider.Provider       = (*Session)(nil)
	_ provider.TurnReconciler = (*Session)(nil)
)
