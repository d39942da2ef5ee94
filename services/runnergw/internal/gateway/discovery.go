package gateway

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/failure"
)

// maxExecutablePath bounds a discovered executable path.
const maxExecutablePath = 4096

// ParseExecutableCandidate accepts the output of a "which runnerd" probe
// (`command -v runnerd` in a shell on the runner host) only when it is one
// normalised absolute path on one line (G1). Relative paths, more than one
// line, whitespace and anything a shell would interpret are refused: the
// answer is later placed on a command line, so it must be inert.
func ParseExecutableCandidate(stdout string) (string, bool) {
	p := strings.TrimSuffix(stdout, "\n")
	if p == "" || len(p) > maxExecutablePath || !strings.HasPrefix(p, "/") {
		return "", false
	}
	for i := 0; i < len(p); i++ {
		if !inertPathByte(p[i]) {
			return "", false // second line, space, control or shell character
		}
	}
	if filepath.Clean(p) != p || p == "/" {
		return "", false // "//", "/./", "/../" or a trailing slash
	}
	return p, true
}

// inertPathByte is the conservative set of bytes allowed in a discovered
// path: letters, digits and / . _ - + @ (no whitespace, quotes, globbing,
// expansion, redirection, separators or escapes).
func inertPathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("/._-+@", c) >= 0
}

// MayUsePreinstalledRunner reports whether a runnerd found on the host (not
// shipped by this build) may be used: only when no build-owned artifact path
// is configured (blank or unset). A configured artifact is never replaced by
// a merely contract-compatible preinstalled binary (G1).
func MayUsePreinstalledRunner(buildOwnedPath string) bool {
	return strings.TrimSpace(buildOwnedPath) == ""
}

// WhichFunc runs a "which runnerd" probe and returns its raw stdout.
type WhichFunc func(ctx context.Context) (string, error)

// ShellWhich probes with `command -v runnerd` in /bin/sh (PATH from the
// gateway's environment).
func ShellWhich(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "/bin/sh", "-c", "command -v runnerd").Output()
	return string(out), err
}

// DiscoverRunnerd resolves the runnerd binary: the build-owned artifact when
// one is configured (it must exist; there is no fallback), else the one
// shipped next to the gateway binary (self, may be ""), else a preinstalled
// runnerd answered by which, accepted only in the strict form of
// ParseExecutableCandidate. preinstalled tells which case applied.
func DiscoverRunnerd(ctx context.Context, buildOwned, self string, which WhichFunc) (path string, preinstalled bool, err error) {
	if !MayUsePreinstalledRunner(buildOwned) {
		p := strings.TrimSpace(buildOwned)
		if !filepath.IsAbs(p) {
			return "", false, failure.New(codes.FailedPrecondition, failure.RunnerArtifactUnavailable,
				"the configured runnerd artifact %q must be an absolute path", p)
		}
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", false, failure.New(codes.FailedPrecondition, failure.RunnerArtifactUnavailable,
				"the configured runnerd artifact %s is not a file; a preinstalled runner is not used instead", p)
		}
		return p, false, nil
	}
	if self != "" {
		cand := filepath.Join(filepath.Dir(self), "runnerd")
		if st, err := os.Stat(cand); err == nil && !st.IsDir() {
			return cand, false, nil
		}
	}
	if which == nil {
		return "", false, errors.New("runnerd not found")
	}
	out, err := which(ctx)
	if err != nil {
		return "", false, failure.New(codes.FailedPrecondition, failure.RunnerArtifactUnavailable,
			"runnerd not found: pass -runnerd-path, or put runnerd next to runnergw or on PATH")
	}
	p, ok := ParseExecutableCandidate(out)
	if !ok {
		return "", false, failure.New(codes.FailedPrecondition, failure.RunnerArtifactUnavailable,
			"the preinstalled runnerd probe answered %q, which is not one normalised absolute path", truncateForLog(out))
	}
	return p, true, nil
}

func truncateForLog(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
