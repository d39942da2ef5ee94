package provhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/tether-run/tether/pkg/procgroup"
)

// SpawnConfig starts a host.
type SpawnConfig struct {
	// Self is the runnerd binary (it serves the provider-host subcommand).
	Self string
	// Dir is runnerd's private runner directory.
	Dir     string
	WorkDir string
	// Env is the provider's complete, allow-listed environment.
	Env           []string
	Command       string
	Args          []string
	SeqBase       uint64
	DetachTimeout time.Duration
	Grace         time.Duration
	RetainBytes   int // 0: DefaultRetainBytes
}

// HostArgs are the provider-host subcommand's arguments.
func HostArgs(c SpawnConfig) []string {
	args := []string{"provider-host", "--dir", c.Dir, "--workdir", c.WorkDir,
		"--seq-base", strconv.FormatUint(c.SeqBase, 10)}
	if c.DetachTimeout > 0 {
		args = append(args, "--detach-timeout", c.DetachTimeout.String())
	}
	if c.Grace > 0 {
		args = append(args, "--grace", c.Grace.String())
	}
	if c.RetainBytes > 0 {
		args = append(args, "--retain-bytes", strconv.Itoa(c.RetainBytes))
	}
	return append(append(args, "--", c.Command), c.Args...)
}

// ShimArgs are the provider-shim subcommand's arguments.
func ShimArgs(dir string, reattach bool, resumeAfter uint64) []string {
	args := []string{"provider-shim", "--socket", filepath.Join(dir, SocketName), "--resume-after", strconv.FormatUint(resumeAfter, 10)}
	if reattach {
		args = append(args, "--reattach")
	}
	return args
}

// Spawn starts a provider host in its own session (it outlives runnerd)
// and waits until it serves. Its output goes to dir/provider-host.log.
func Spawn(ctx context.Context, c SpawnConfig) (*Info, error) {
	logf, err := os.OpenFile(filepath.Join(c.Dir, LogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	cmd := exec.Command(c.Self, HostArgs(c)...)
	cmd.Env = append(make([]string, 0, len(c.Env)), c.Env...)
	cmd.Dir = c.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{wr} // fd 3: the ready line
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		wr.Close()
		return nil, fmt.Errorf("starting the provider host: %w", err)
	}
	wr.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it if it dies while runnerd lives
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(rd).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("unexpected %q", line)
		}
		ready <- err
	}()
	select {
	case err := <-ready:
		if err != nil {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("the provider host did not start (see %s): %w", filepath.Join(c.Dir, LogName), err)
		}
	case err := <-exited:
		return nil, fmt.Errorf("the provider host exited at start (see %s): %v", filepath.Join(c.Dir, LogName), err)
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return nil, ctx.Err()
	}
	return ReadInfo(c.Dir)
}

// Stop asks a host to stop its provider (SIGTERM: stdin EOF, grace, TERM
// and KILL to the provider's group) and waits until both are gone, killing
// them after 2*grace+2s.
func Stop(in *Info, grace time.Duration) error {
	if in == nil {
		return nil
	}
	if in.HostAlive() {
		_ = syscall.Kill(in.HostPID, syscall.SIGTERM)
	}
	deadline := time.Now().Add(2*grace + 2*time.Second)
	for time.Now().Before(deadline) {
		if !in.HostAlive() && !in.ProviderAlive() {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	if in.ProviderAlive() {
		procgroup.Kill(in.ProviderPGID)
	}
	if in.HostAlive() {
		_ = syscall.Kill(in.HostPID, syscall.SIGKILL)
	}
	for i := 0; i < 200 && (in.HostAlive() || in.ProviderAlive()); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if in.HostAlive() || in.ProviderAlive() {
		return errors.New("provider host or provider still alive after SIGKILL")
	}
	return nil
}
