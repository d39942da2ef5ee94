package fakecodex

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestT7_ProbeMarkersReportWhatTheProviderCanReach(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	missing := filepath.Join(dir, "missing")
	out := probes("do [probe-write:" + file + "] then [probe-read:" + file + "] [probe-list:" + dir + "] [probe-read:" + missing + "] [probe-bogus:x] [probe-read:unterminated")
	require.Equal(t, []string{
		ProbeOK("write", file),
		ProbeOK("read", file) + " 5 bytes",
		ProbeOK("list", dir) + " f",
		ProbeFailed("read", missing) + " not found",
	}, out)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, "probe", string(b))

	// A swap moves the file aside and links its name to the target.
	target := filepath.Join(dir, "target")
	require.Equal(t, []string{ProbeOK("swap", file+">"+target)}, probes("[probe-swap:"+file+">"+target+"]"))
	got, err := os.Readlink(file)
	require.NoError(t, err)
	require.Equal(t, target, got)
	require.FileExists(t, file+".swapped")
}
