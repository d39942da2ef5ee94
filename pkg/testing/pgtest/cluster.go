// Package pgtest runs throwaway PostgreSQL servers for tests and for the
// local demo.
//
// Start initdb's a cluster into a fresh temporary directory, starts it with
// pg_ctl on a free loopback port (unix sockets live in the same directory) and
// waits until it accepts connections. Close stops it (pg_ctl stop -m fast),
// waits for the postmaster to exit and removes the directory.
//
// initdb and postgres refuse to run as root. When the process is root, the
// server runs as the system user "tether-pg" (created with useradd when
// missing), falling back to "nobody"; otherwise it runs as the current user.
//
// If the owning process dies without calling Close (SIGKILL, a go test
// timeout, os.Exit without TestMain cleanup), a small watchdog process, which
// holds the read end of a pipe whose write end only this process has, notices
// EOF, stops the server and removes the directory. This is best effort: a
// watchdog that is itself killed leaves the server behind.
//
// For tests, see NewDB and Main.
package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Superuser is the name of the bootstrap superuser of clusters made by Start.
// Connections are trusted (no password) and only accepted on 127.0.0.1 and
// on the cluster's private unix socket directory.
const Superuser = "postgres"

// ErrNoPostgres is returned (wrapped) by Start when the PostgreSQL server
// binaries cannot be found.
var ErrNoPostgres = errors.New(`pgtest: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; install the Debian package "postgresql" (e.g. apt-get install -y postgresql)`)

// Option configures Start.
type Option func(*options)

type options struct {
	durable      bool
	binDir       string
	settings     [][2]string
	startTimeout time.Duration
}

// WithDurable keeps fsync, synchronous_commit and full_page_writes on. By
// default they are off, which is what tests want: a crash of the test
// machine loses nothing anyone cares about.
func WithDurable() Option { return func(o *options) { o.durable = true } }

// WithBinDir uses the PostgreSQL binaries in dir instead of searching PATH and
// /usr/lib/postgresql/*/bin.
func WithBinDir(dir string) Option { return func(o *options) { o.binDir = dir } }

// WithSetting adds a postgresql.conf setting, e.g. WithSetting("max_connections", "300").
// The value is written verbatim (quote strings yourself: "'C'").
func WithSetting(name, value string) Option {
	return func(o *options) { o.settings = append(o.settings, [2]string{name, value}) }
}

// WithStartTimeout bounds how long Start waits for the server to accept
// connections (default 60s).
func WithStartTimeout(d time.Duration) Option { return func(o *options) { o.startTimeout = d } }

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	dir     string // temp root: sockets, log, data/
	dataDir string
	logPath string
	binDir  string
	port    int
	cred    *syscall.Credential // nil: run as ourselves
	pid     int                 // postmaster pid

	watchdog  *exec.Cmd
	watchdogW *os.File

	closeOnce sync.Once
	closeErr  error
}

// Start creates and starts a new cluster. The context bounds start-up only.
func Start(ctx context.Context, opts ...Option) (_ *Cluster, err error) {
	o := options{startTimeout: 60 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	binDir, err := findBinDir(o.binDir)
	if err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = serverCredential(); err != nil {
			return nil, err
		}
	}
	base, err := tempBase(cred != nil)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(base, "tether-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{
		dir:     dir,
		dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "postgres.log"),
		binDir:  binDir,
		cred:    cred,
	}
	defer func() {
		if err != nil {
			_ = c.stop() // best effort: the start failed already
			c.dismissWatchdog()
			_ = os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	if err := c.initdb(ctx, o); err != nil {
		return nil, err
	}
	if err := c.writeConfig(o); err != nil {
		return nil, err
	}
	if err := c.start(ctx, o); err != nil {
		return nil, err
	}
	if err := c.startWatchdog(); err != nil {
		return nil, err
	}
	if err := c.ping(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// Port is the TCP port the server listens on (127.0.0.1 only).
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's temporary root directory (removed by Close).
func (c *Cluster) Dir() string { return c.dir }

// LogPath is the server log file (inside Dir).
func (c *Cluster) LogPath() string { return c.logPath }

// DSN returns a URL connecting as the superuser to dbname over TCP.
func (c *Cluster) DSN(dbname string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CreateDatabase creates an empty database owned by the superuser.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	return execAdmin(ctx, c.DSN("postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
}

// DropDatabase drops a database, terminating its connections.
func (c *Cluster) DropDatabase(ctx context.Context, name string) error {
	return execAdmin(ctx, c.DSN("postgres"), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Close stops the server, waits for the postmaster to exit and removes the
// directory. It is safe to call more than once.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var errs []error
		if err := c.stop(); err != nil {
			errs = append(errs, err)
		}
		c.dismissWatchdog()
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("pgtest: removing %s: %w", c.dir, err))
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

func execAdmin(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", sql, err)
	}
	return nil
}

// command builds a command running as the server user.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.Env = serverEnv()
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	return cmd
}

// serverEnv is our environment without libpq/PG variables that would
// redirect initdb or pg_ctl to another cluster.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "TZ=UTC")
}

func (c *Cluster) initdb(ctx context.Context, o options) error {
	args := []string{
		"-D", c.dataDir,
		"-U", Superuser,
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
	}
	if !o.durable {
		args = append(args, "--no-sync")
	}
	out, err := c.command(ctx, "initdb", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: initdb: %w\n%s", err, tail(out, 4000))
	}
	return nil
}

func (c *Cluster) writeConfig(o options) error {
	var b strings.Builder
	b.WriteString("\n# pgtest\n")
	set := func(k, v string) { fmt.Fprintf(&b, "%s = %s\n", k, v) }
	set("listen_addresses", "'127.0.0.1'")
	set("unix_socket_directories", quoteConf(c.dir))
	set("unix_socket_permissions", "0700")
	set("logging_collector", "off")
	set("log_timezone", "'UTC'")
	set("timezone", "'UTC'")
	if !o.durable {
		set("fsync", "off")
		set("synchronous_commit", "off")
		set("full_page_writes", "off")
	}
	for _, kv := range o.settings {
		set(kv[0], kv[1])
	}
	// Appending keeps the file's owner (the server user).
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("pgtest: %w", err)
	}
	return f.Close()
}

func quoteConf(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// start picks a free port and runs pg_ctl start, retrying with another port
// when the chosen one was taken in the meantime.
func (c *Cluster) start(ctx context.Context, o options) error {
	const attempts = 5
	var lastErr error
	for range attempts {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.port = port
		logOffset := fileSize(c.logPath)
		secs := max(int(o.startTimeout/time.Second), 1)
		out, err := c.command(ctx, "pg_ctl", "start",
			"-D", c.dataDir,
			"-l", c.logPath,
			"-w", "-t", strconv.Itoa(secs),
			"-o", "-p "+strconv.Itoa(port),
		).CombinedOutput()
		if err == nil {
			pid, perr := readPostmasterPID(c.dataDir)
			if perr != nil {
				return perr
			}
			c.pid = pid
			return nil
		}
		logTail := readFrom(c.logPath, logOffset)
		lastErr = fmt.Errorf("pgtest: pg_ctl start: %w\n%s\n%s", err, tail(out, 2000), tail(logTail, 4000))
		if ctx.Err() != nil {
			return lastErr
		}
		if !bytes.Contains(logTail, []byte("could not bind")) &&
			!bytes.Contains(logTail, []byte("Address already in use")) &&
			!bytes.Contains(logTail, []byte("could not create any TCP/IP sockets")) {
			return lastErr
		}
		// Port race: make sure nothing half-started remains, then retry
		// (a stop that fails leaves a server the next start's port check
		// or the watchdog deals with).
		_ = c.stop()
	}
	return lastErr
}

func (c *Cluster) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: server did not accept connections: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop shuts the server down (fast, then immediate) and waits until the
// postmaster process is gone.
func (c *Cluster) stop() error {
	if c.pid == 0 {
		if pid, err := readPostmasterPID(c.dataDir); err == nil {
			c.pid = pid
		} else {
			return nil // never started
		}
	}
	ctx := context.Background()
	var errs []error
	if out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "fast", "-w", "-t", "30").CombinedOutput(); err != nil && processAlive(c.pid) {
		errs = append(errs, fmt.Errorf("pgtest: pg_ctl stop -m fast: %w\n%s", err, tail(out, 2000)))
		if out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "30").CombinedOutput(); err != nil && processAlive(c.pid) {
			errs = append(errs, fmt.Errorf("pgtest: pg_ctl stop -m immediate: %w\n%s", err, tail(out, 2000)))
		}
	}
	// pg_ctl returns once postmaster.pid is gone, which is just before the
	// postmaster exits. Wait for the exit itself.
	deadline := time.Now().Add(15 * time.Second)
	for processAlive(c.pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(c.pid, syscall.SIGKILL)
			errs = append(errs, fmt.Errorf("pgtest: postmaster %d did not exit; killed", c.pid))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.pid = 0
	return errors.Join(errs...)
}

// watchdogScript runs in its own session, ignoring terminal signals. It
// blocks reading stdin: "exit" means the owner closed the cluster; EOF means
// the owner died, so it stops the server and removes the directory.
const watchdogScript = `trap '' INT TERM HUP QUIT
if read -r cmd && [ "$cmd" = exit ]; then exit 0; fi
"$1" stop -D "$2" -m fast -w -t 20 >/dev/null 2>&1 || "$1" stop -D "$2" -m immediate -w -t 20 >/dev/null 2>&1
rm -rf "$3"
`

func (c *Cluster) startWatchdog() error {
	r, w, err := os.Pipe() // O_CLOEXEC: no other child inherits w
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgtest-watchdog",
		filepath.Join(c.binDir, "pg_ctl"), c.dataDir, c.dir)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return fmt.Errorf("pgtest: starting watchdog: %w", err)
	}
	r.Close()
	c.watchdog, c.watchdogW = cmd, w
	return nil
}

func (c *Cluster) dismissWatchdog() {
	if c.watchdog == nil {
		return
	}
	_, _ = io.WriteString(c.watchdogW, "exit\n")
	_ = c.watchdogW.Close()
	done := make(chan struct{})
	go func() { _ = c.watchdog.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.watchdog.Process.Kill()
		<-done
	}
	c.watchdog, c.watchdogW = nil, nil
}

func readPostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pgtest: bad postmaster.pid %q", line)
	}
	return pid, nil
}

// processAlive reports whether pid exists and is not a zombie (an orphaned
// postmaster is reaped by init, which in containers may never happen).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		// No /proc entry means gone, unless there is no /proc at all.
		return !errors.Is(err, os.ErrNotExist) || !procMounted()
	}
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		switch b[i+2] {
		case 'Z', 'X':
			return false
		}
	}
	return true
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: picking a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// findBinDir returns the directory holding initdb, pg_ctl and postgres.
func findBinDir(explicit string) (string, error) {
	has := func(dir string) bool {
		for _, n := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if explicit != "" {
		if has(explicit) {
			return explicit, nil
		}
		return "", fmt.Errorf("%w (looked in %s)", ErrNoPostgres, explicit)
	}
	if p, err := exec.LookPath("pg_ctl"); err == nil {
		// Resolve symlinks (e.g. /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl)
		// so all three binaries come from one installation.
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	type cand struct {
		dir string
		ver []int
	}
	var cands []cand
	for _, m := range matches {
		if !has(m) {
			continue
		}
		var ver []int
		for _, part := range strings.Split(filepath.Base(filepath.Dir(m)), ".") {
			n, _ := strconv.Atoi(part)
			ver = append(ver, n)
		}
		cands = append(cands, cand{m, ver})
	}
	if len(cands) == 0 {
		return "", ErrNoPostgres
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i].ver, cands[j].ver
		for k := 0; k < len(a) && k < len(b); k++ {
			if a[k] != b[k] {
				return a[k] > b[k]
			}
		}
		return len(a) > len(b)
	})
	return cands[0].dir, nil
}

// ServerUser is the system user clusters run as when the process is root.
const ServerUser = "tether-pg"

var userMu sync.Mutex

// serverCredential finds (or, as root, creates) the unprivileged user the
// server runs as.
func serverCredential() (*syscall.Credential, error) {
	userMu.Lock()
	defer userMu.Unlock()
	if cred, ok := lookupCred(ServerUser); ok {
		return cred, nil
	}
	var lastOut []byte
	for range 5 {
		out, err := exec.Command("useradd", "--system", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
			"--user-group", ServerUser).CombinedOutput()
		if cred, ok := lookupCred(ServerUser); ok {
			return cred, nil
		}
		if err == nil {
			break
		}
		lastOut = out
		// Another process may hold the passwd lock; try again.
		time.Sleep(200 * time.Millisecond)
	}
	if cred, ok := lookupCred("nobody"); ok {
		return cred, nil
	}
	return nil, fmt.Errorf("pgtest: running as root, and neither user %q (useradd: %s) nor \"nobody\" is available; initdb refuses to run as root", ServerUser, strings.TrimSpace(string(lastOut)))
}

func lookupCred(name string) (*syscall.Credential, bool) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, false
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, false
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, true
}

// tempBase picks the parent of the cluster directory: os.TempDir() unless the
// unix socket path would be too long or, when running as another user, that
// user could not reach it.
func tempBase(otherUser bool) (string, error) {
	const maxSock = 100 // sun_path is 108 bytes; leave room for /tether-pg-NNN/.s.PGSQL.NNNNN
	ok := func(dir string) bool {
		if len(dir)+len("/tether-pg-1234567890/.s.PGSQL.65535") > maxSock {
			return false
		}
		return !otherUser || traversable(dir)
	}
	if d := os.TempDir(); ok(d) {
		return d, nil
	}
	if ok("/tmp") {
		return "/tmp", nil
	}
	return "", errors.New("pgtest: no usable temporary directory (TMPDIR too long, or not reachable by the server user)")
}

// traversable reports whether every ancestor of dir is searchable by others.
func traversable(dir string) bool {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false
	}
	for {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func readFrom(path string, off int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return b
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
