// Package testbin gives tests the binaries of tether's main packages.
//
// `make test` builds every binary once into a directory it names in
// $TETHER_TEST_BIN (EnvDir) before the tests start, so that the packages
// running real processes (the end-to-end stack, runnerd, the gateway, the
// providers) neither build nor link their own copies. A plain `go test`
// builds what a test asks for, once per test process, into a temporary
// directory that Cleanup removes.
package testbin

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// EnvDir names the environment variable holding a directory of prebuilt
// binaries, each named by the last element of its package's import path.
const EnvDir = "TETHER_TEST_BIN"

var built struct {
	mu  sync.Mutex
	dir string
}

// Dir returns a directory holding the binaries of the main packages pkgs
// (import paths): $TETHER_TEST_BIN when it holds all of them, otherwise
// this process's build directory, into which the missing ones are built
// (one go build).
func Dir(pkgs ...string) (string, error) {
	if dir := os.Getenv(EnvDir); dir != "" && len(missing(dir, pkgs)) == 0 {
		return dir, nil
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "tether-test-bin-")
		if err != nil {
			return "", err
		}
		built.dir = dir
	}
	if todo := missing(built.dir, pkgs); len(todo) > 0 {
		cmd := exec.Command("go", append([]string{"build", "-o", built.dir + "/"}, todo...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build %v: %v\n%s", todo, err, out)
		}
	}
	return built.dir, nil
}

// Path returns the path of the binary of the main package pkg (see Dir).
func Path(pkg string) (string, error) {
	dir, err := Dir(pkg)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, path.Base(pkg)), nil
}

// MustDir is Dir for a TestMain: a failed build ends the test process.
func MustDir(pkgs ...string) string {
	dir, err := Dir(pkgs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	return dir
}

// Main runs the package's tests, removes what Dir built and exits:
//
//	func TestMain(m *testing.M) { testbin.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}

// Parallel is for a TestMain whose tests mostly wait on the processes they
// run: it lets n of them run at once (-test.parallel n) instead of
// GOMAXPROCS, unless the command line sets -parallel. On a 2-core machine
// the gateway's tests took 53 s at -parallel 2 and 20 s at 4, with the
// same CPU time.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}

// Cleanup removes what Dir built in this process (never $TETHER_TEST_BIN).
func Cleanup() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
		built.dir = ""
	}
}

func missing(dir string, pkgs []string) []string {
	var out []string
	for _, p := range pkgs {
		if fi, err := os.Stat(filepath.Join(dir, path.Base(p))); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			out = append(out, p)
		}
	}
	return out
}
