// Package buildinfo says which build of tether a binary is (SPEC L4): the
// release version stamped by make build (-ldflags -X), and the commit,
// commit time and toolchain Go recorded in the binary's build information.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at link time by make build:
// -X github.com/tether-run/tether/pkg/buildinfo.version=$(git describe --tags --always --dirty).
var version string

// Info identifies a build.
type Info struct {
	// Version is the release version (a tag such as v0.1.0, or git
	// describe's <tag>-<n>-g<commit>), else the main module's version,
	// else "devel".
	Version string
	// Commit is the VCS revision the binary was built from ("unknown"
	// when the build recorded none); Modified: the tree had local changes.
	Commit   string
	Modified bool
	// Time is the commit time (RFC 3339), empty when unknown.
	Time string
	// Go is the toolchain version.
	Go string
}

// Read returns this binary's Info.
func Read() Info {
	i := Info{Version: version, Commit: "unknown", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// Line is the one line `-version` prints for binary, e.g.
// "executor v0.1.0 (commit 0123abcd…, 2026-12-06T19:25:20Z, go1.26.8)".
func (i Info) Line(binary string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (commit %s", binary, i.Version, i.Commit)
	if i.Modified {
		b.WriteString(", modified")
	}
	if i.Time != "" {
		b.WriteString(", " + i.Time)
	}
	b.WriteString(", " + i.Go + ")")
	return b.String()
}
