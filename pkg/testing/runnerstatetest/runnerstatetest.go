// Package runnerstatetest holds test helpers over runnerd's state document.
package runnerstatetest

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/runnerstate"
)

// SetRunnerInstance rewrites the runner instance id in the state document
// under stateRoot, as a replacement sandbox with another runner's state
// would present it (the rest of the document is kept as it is).
func SetRunnerInstance(t testing.TB, stateRoot, instanceID string) {
	t.Helper()
	path := runnerstate.Path(stateRoot)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	doc["identity"].(map[string]any)["runnerInstanceId"] = instanceID
	b, err = json.Marshal(doc)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
}
