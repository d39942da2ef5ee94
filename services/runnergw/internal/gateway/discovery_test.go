package gateway

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/failure"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
	"github.com/tether-run/tether/pkg/prp"
)

func TestG1_AcceptsOneNormalisedAbsoluteExecutablePath(t *testing.T) {
	t.Parallel()
	p, ok := ParseExecutableCandidate("/home/sandbox/.local/bin/runnerd\n")
	require.True(t, ok)
	require.Equal(t, "/home/sandbox/.local/bin/runnerd", p)
	p, ok = ParseExecutableCandidate("/usr/local/bin/runnerd")
	require.True(t, ok, "a missing final newline is still one line")
	require.Equal(t, "/usr/local/bin/runnerd", p)
}

func TestG1_RejectsARelativePath(t *testing.T) {
	t.Parallel()
	for _, out := range []string{"runnerd\n", "./runnerd\n", "bin/runnerd\n", "~/bin/runnerd\n", "\n", ""} {
		_, ok := ParseExecutableCandidate(out)
		require.False(t, ok, "%q", out)
	}
}

func TestG1_RejectsTwoLines(t *testing.T) {
	t.Parallel()
	for _, out := range []string{"/safe/path\n/unexpected/second-line\n", "/safe/path\n\n", "/safe/path\r\n", "\n/safe/path\n"} {
		_, ok := ParseExecutableCandidate(out)
		require.False(t, ok, "%q", out)
	}
}

func TestG1_RejectsSpaces(t *testing.T) {
	t.Parallel()
	for _, out := range []string{"/safe/path with spaces\n", "/safe/path\t\n", " /safe/path\n", "/safe/path \n"} {
		_, ok := ParseExecutableCandidate(out)
		require.False(t, ok, "%q", out)
	}
}

func TestG1_RejectsShellMetacharactersAndUnnormalisedPaths(t *testing.T) {
	t.Parallel()
	for _, out := range []string{
		"/safe/path;touch-bad\n", "/safe/$(id)\n", "/safe/`id`\n", "/safe/path|x\n", "/safe/path&\n",
		"/safe/*\n", "/safe/pa?h\n", "/safe/'q'\n", "/safe/\"q\"\n", "/safe/a>b\n", "/safe/a\\b\n", "/safe/\x00x\n",
		"/safe//path\n", "/safe/./path\n", "/safe/../path\n", "/safe/path/\n", "/\n", "/sáfe/path\n",
	} {
		_, ok := ParseExecutableCandidate(out)
		require.False(t, ok, "%q", out)
	}
}

func TestG1_PreinstalledRunnerOnlyWithoutABuildOwnedArtifact(t *testing.T) {
	t.Parallel()
	require.False(t, MayUsePreinstalledRunner("/artifacts/runnerd"))
	require.True(t, MayUsePreinstalledRunner("  "))
	require.True(t, MayUsePreinstalledRunner(""), "unset")

	ctx := context.Background()
	dir := t.TempDir()
	preinstalled := func(context.Context) (string, error) { return "/usr/local/bin/runnerd\n", nil }
	// A configured artifact is used, never the preinstalled runner, even when
	// it is missing.
	_, _, err := DiscoverRunnerd(ctx, filepath.Join(dir, "missing-runnerd"), "", preinstalled)
	require.EqualValues(t, "runner_artifact_unavailable", failure.CodeOf(err))
	art := filepath.Join(dir, "runnerd")
	require.NoError(t, os.WriteFile(art, []byte("#!/bin/sh\n"), 0o755))
	p, pre, err := DiscoverRunnerd(ctx, art, "", preinstalled)
	require.NoError(t, err)
	require.Equal(t, art, p)
	require.False(t, pre)
	// Unset: the one shipped next to the gateway first, then a strict probe.
	p, pre, err = DiscoverRunnerd(ctx, "", filepath.Join(dir, "runnergw"), preinstalled)
	require.NoError(t, err)
	require.Equal(t, art, p)
	require.False(t, pre)
	p, pre, err = DiscoverRunnerd(ctx, " ", "", preinstalled)
	require.NoError(t, err)
	require.Equal(t, "/usr/local/bin/runnerd", p)
	require.True(t, pre)
	_, _, err = DiscoverRunnerd(ctx, "", "", func(context.Context) (string, error) { return "/x;rm -rf /\n", nil })
	require.EqualValues(t, "runner_artifact_unavailable", failure.CodeOf(err))
	_, _, err = DiscoverRunnerd(ctx, "", "", func(context.Context) (string, error) { return "", errors.New("exit status 1") })
	require.EqualValues(t, "runner_artifact_unavailable", failure.CodeOf(err))
}

func TestG3_UnauthorisedRunFailsBeforeSelectingSandboxIngress(t *testing.T) {
	t.Parallel()
	_, err := ResolveTransportMode(gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, false)
	require.EqualValues(t, "runner_ingress_unavailable", failure.CodeOf(err))
}

func TestG3_AuthorisedRunSelectsSandboxIngress(t *testing.T) {
	t.Parallel()
	m, err := ResolveTransportMode(gatewayv1.TransportMode_TRANSPORT_MODE_LISTEN_WS, true)
	require.NoError(t, err)
	require.Equal(t, prp.ModeListenWS, m)
	// The other modes need no ingress authorisation.
	m, err = ResolveTransportMode(gatewayv1.TransportMode_TRANSPORT_MODE_DIAL_WSS, false)
	require.NoError(t, err)
	require.Equal(t, prp.ModeDialWSS, m)
	m, err = ResolveTransportMode(gatewayv1.TransportMode_TRANSPORT_MODE_UNSPECIFIED, false)
	require.NoError(t, err)
	require.Equal(t, prp.ModeDialWSLoopback, m)
	_, err = ResolveTransportMode(gatewayv1.TransportMode(42), true)
	require.EqualValues(t, "runner_transport_ineligible", failure.CodeOf(err))

	pol := ParseIngressPolicy("acme, beta")
	require.True(t, pol.Admits("acme"))
	require.False(t, pol.Admits("gamma"))
	require.False(t, pol.Admits(""))
	require.True(t, ParseIngressPolicy("*").Admits("anyone"))
	require.False(t, ParseIngressPolicy("").Enabled())
}
