package buildinfo

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestL4_InfoNamesTheVersionCommitAndToolchain(t *testing.T) {
	saved := version
	t.Cleanup(func() { version = saved })

	version = ""
	i := Read()
	require.Equal(t, "devel", i.Version, "a test binary has no release version")
	require.Equal(t, runtime.Version(), i.Go)
	require.NotEmpty(t, i.Commit)

	version = "v0.1.0"
	require.Equal(t, "v0.1.0", Read().Version, "the linked version wins")

	for _, tc := range []struct {
		info Info
		want string
	}{
		{Info{Version: "v0.1.0", Commit: "abc", Time: "2026-12-06T19:25:20Z", Go: "go1.26.8"},
			"executor v0.1.0 (commit abc, 2026-12-06T19:25:20Z, go1.26.8)"},
		{Info{Version: "devel", Commit: "unknown", Go: "go1.26.8"}, "executor devel (commit unknown, go1.26.8)"},
		{Info{Version: "v0.1.0-3-gabc-dirty", Commit: "abc", Modified: true, Go: "go1.26.8"},
			"executor v0.1.0-3-gabc-dirty (commit abc, modified, go1.26.8)"},
	} {
		require.Equal(t, tc.want, tc.info.Line("executor"))
	}
}
