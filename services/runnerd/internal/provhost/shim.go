package provhost

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Shim exit codes.
const (
	ShimExitClosed   = 0 // stdin closed: the driver (or runnerd) went away
	ShimExitGone     = 1 // the host closed the connection: the provider ended
	ShimExitRefused  = 3 // the host refused the attach
	ShimExitNoHost   = 4 // no host listens on the socket
	ShimExitBadUsage = 2
)

// RunShim connects stdin/stdout to the provider host listening on socket
// (runnerd's codex driver spawns it in place of the provider). It returns
// when either side closes.
func RunShim(socket string, reattach bool, resumeAfter uint64, stdin io.Reader, stdout, stderr io.Writer) int {
	dir, name := filepath.Split(socket)
	if dir != "" {
		// A relative name keeps the socket path short whatever the dir.
		if err := os.Chdir(dir); err != nil {
			fmt.Fprintf(stderr, "provider-shim: %v\n", err)
			return ShimExitNoHost
		}
	}
	conn, err := net.DialTimeout("unix", name, 5*time.Second)
	if err != nil {
		fmt.Fprintf(stderr, "provider-shim: no provider host: %v\n", err)
		return ShimExitNoHost
	}
	defer conn.Close()
	b, _ := json.Marshal(handshake{Reattach: reattach, ResumeAfter: resumeAfter})
	if _, err := conn.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(stderr, "provider-shim: %v\n", err)
		return ShimExitNoHost
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	raw, err := readLine(br, maxHandshakeBytes)
	_ = conn.SetReadDeadline(time.Time{})
	var rep handshakeReply
	if err != nil || json.Unmarshal(raw, &rep) != nil {
		fmt.Fprintf(stderr, "provider-shim: no answer from the provider host: %v\n", err)
		return ShimExitNoHost
	}
	if !rep.OK {
		fmt.Fprintf(stderr, "provider-shim: the provider host refused: %s\n", rep.Error)
		return ShimExitRefused
	}
	done := make(chan int, 2)
	go func() {
		_, _ = io.Copy(conn, stdin)
		done <- ShimExitClosed
	}()
	go func() {
		_, _ = io.Copy(stdout, br)
		done <- ShimExitGone
	}()
	return <-done
}
