package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/failure"
	"github.com/tether-run/tether/services/runnerd/internal/acp"
	"github.com/tether-run/tether/services/runnerd/internal/runner"
)

// startACP adapts acp.Start to runner.StartFunc for the ACPX agents
// (SPEC R11, launch profiles acpx-codex and acpx-claude). The agent, its
// homes and the driver's durable state live under the scope root's acpx/
// (SPEC B2); the operator's home template (launch-only credentials and
// configuration, e.g. codex's config.toml) is copied into the agent's home
// before every start. The agent is runnerd's direct child in its own process group,
// not hosted: after a runnerd crash there is nothing to re-attach to, so a
// re-attach is refused as provider_process_lost (the runner then kills
// what is left of the old group and loads the session in a new process).
func startACP(ctx context.Context, cfg runner.ProviderConfig, emit func(runner.ProviderEvent)) (runner.Provider, error) {
	if cfg.Reattach {
		return nil, &runner.ProviderError{Code: failure.ProviderProcessLost, Message: "an ACP agent does not survive its runnerd (it is not hosted); the session is loaded in a new process"}
	}
	dir := filepath.Join(cfg.StateDir, "acpx")
	if err := acp.MakeHomes(dir, cfg.Agent); err != nil {
		return nil, &runner.ProviderError{Code: failure.ProviderSpawnFailed, Message: err.Error()}
	}
	if err := acp.CopyTemplate(cfg.HomeTemplate, dir, cfg.Agent); err != nil {
		return nil, &runner.ProviderError{Code: failure.ProviderConfigInvalid, Message: err.Error()}
	}
	s, err := acp.Start(ctx, acp.Config{
		Command: cfg.Command, Args: cfg.Args, Env: acp.Environment(cfg.Env, dir, cfg.Agent, os.Geteuid() == 0),
		Dir: cfg.Dir, StateDir: dir, Agent: cfg.Agent, PermissionMode: cfg.PermissionMode, Model: cfg.Model,
		StartupTimeout: cfg.StartupTimeout, RequestTimeout: cfg.RequestTimeout, Logger: cfg.Logger,
	}, func(ev acp.Event) {
		emit(runner.ProviderEvent{Type: ev.Type, TurnID: ev.TurnID, ItemID: ev.ItemID, Priority: ev.Priority, Payload: ev.Payload})
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

var (
	_ runner.Provider       = (*acp.Session)(nil)
	_ runner.TurnReconciler = (*acp.Session)(nil)
)
