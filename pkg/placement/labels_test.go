package placement

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestF1_LabelsParseFormatAndMatch(t *testing.T) {
	l, err := ParseLabels(" zone=a, gpu=false ,,")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"zone": "a", "gpu": "false"}, l)
	require.Equal(t, "gpu=false,zone=a", FormatLabels(l))
	for _, bad := range []string{"zone", "=a", "zone=a,zone=b"} {
		_, err := ParseLabels(bad)
		require.Error(t, err, bad)
	}
	require.True(t, Satisfies(l, nil))
	require.True(t, Satisfies(l, map[string]string{"zone": "a"}))
	require.False(t, Satisfies(l, map[string]string{"zone": "b"}))
	require.False(t, Satisfies(l, map[string]string{"region": "eu"}))
}
