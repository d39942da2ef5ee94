package runner

import "github.com/tether-run/tether/services/runnerd/internal/provider"

// The provider contract is package provider's; the runner uses its names.
type (
	Provider               = provider.Provider
	TurnReconciler         = provider.TurnReconciler
	TurnDropper            = provider.TurnDropper
	ReattachReconciler     = provider.ReattachReconciler
	RuntimeRequestProvider = provider.RuntimeRequestProvider
	TurnStartLost          = provider.TurnStartLost
	StartFunc              = provider.StartFunc
	ProviderConfig         = provider.Config
	ProviderEvent          = provider.Event
	TurnResult             = provider.TurnResult
	Artifact               = provider.Artifact
	Usage                  = provider.Usage
	ProcessInfo            = provider.ProcessInfo
	// ProviderError is a provider failure with a stable code (drivers
	// return it).
	ProviderError = provider.Error
)

// What happened to a lost turn in the provider's history and how a lost
// turn was reconciled (see package provider).
const (
	HistoryDropped        = provider.HistoryDropped
	HistoryKept           = provider.HistoryKept
	HistoryAbsent         = provider.HistoryAbsent
	ReconcileRetained     = provider.ReconcileRetained
	ReconcileTerminalized = provider.ReconcileTerminalized
	ReconcileMissing      = provider.ReconcileMissing
)
