package main

import (
	"bytes"
	"errors"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tether-run/tether/pkg/testing/testbin"
)

func TestMain(m *testing.M) { testbin.Main(m) }

// TestD1_UpFailsLoudlyWhenAPortIsTaken: `make up` (tether-demo -up) on a
// port another stack holds exits non-zero naming the port, before it starts
// anything, instead of reporting "stack is up" answered by the other stack.
func TestD1_UpFailsLoudlyWhenAPortIsTaken(t *testing.T) {
	t.Parallel()
	bin, err := testbin.Path("github.com/tether-run/tether/services/executor/tools/tether-demo")
	require.NoError(t, err)

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	port := taken.Addr().(*net.TCPAddr).Port

	cmd := exec.Command(bin, "-up", "-base-port", strconv.Itoa(port))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "want a non-zero exit, got %v; stdout: %s", err, stdout.String())
	require.Equal(t, 1, exit.ExitCode())
	msg := stderr.String()
	require.Contains(t, msg, "executor gRPC 127.0.0.1:"+strconv.Itoa(port)+" is already in use")
	require.NotContains(t, stdout.String(), "stack is up")
	require.False(t, strings.Contains(stdout.String(), "PostgreSQL"), "nothing may start before the ports are checked")
}

func TestD1_UpPortsServeMetricsOnTheDocumentedPorts(t *testing.T) {
	t.Parallel()
	p := upPorts(7400)
	require.Equal(t, map[string]int{
		"executor gRPC": 7400, "runnergw gRPC": 7401, "backup-verifier gRPC": 7402, "runner WebSocket": 7411,
		"executor HTTP": 7480, "executor metrics": 9400, "runnergw metrics": 9401, "backup-verifier metrics": 9402,
	}, p)
}
