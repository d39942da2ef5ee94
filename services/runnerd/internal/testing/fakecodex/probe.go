package fakecodex

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File probes, driven by markers in the turn's last user message, so a test
// can make the provider try what a tool command would (SPEC T7: a confined
// provider reads its own workspace and nothing of the gateway's or other
// tenants'):
//
//   - "[probe-read:PATH]": read the file;
//   - "[probe-list:PATH]": list the directory;
//   - "[probe-write:PATH]": create (or replace) the file with "probe";
//   - "[probe-swap:PATH>TARGET]": move PATH aside (to PATH.swapped) if it
//     exists and put a symbolic link to TARGET in its place — what a
//     runner would do to redirect a write of the gateway's (SPEC T7).
//
// Each outcome is appended to the reply, in marker order, as
// "[probe-KIND PATH: ok …]" or "[probe-KIND PATH: error <reason>]", where
// reason is "permission denied", "not found" or the error's text.

// ProbeOK is the outcome a successful probe reports for path:
// "probe-<kind> <path>: ok".
func ProbeOK(kind, path string) string { return "probe-" + kind + " " + path + ": ok" }

// ProbeFailed is the prefix of a failed probe's outcome.
func ProbeFailed(kind, path string) string { return "probe-" + kind + " " + path + ": error" }

var probeKinds = []string{"read", "list", "write", "swap"}

// probes runs the probes the prompt names and returns their outcomes.
func probes(prompt string) []string {
	var out []string
	for rest := prompt; ; {
		i := strings.Index(rest, "[probe-")
		if i < 0 {
			return out
		}
		rest = rest[i+len("[probe-"):]
		j := strings.IndexByte(rest, ']')
		if j < 0 {
			return out
		}
		kind, path, ok := strings.Cut(rest[:j], ":")
		rest = rest[j+1:]
		if !ok || !contains(probeKinds, kind) {
			continue
		}
		if kind == "swap" {
			out = append(out, probe(kind, path))
			continue
		}
		out = append(out, probe(kind, filepath.Clean(path)))
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func probe(kind, path string) string {
	var detail string
	var err error
	switch kind {
	case "read":
		var b []byte
		if b, err = os.ReadFile(path); err == nil {
			detail = fmt.Sprintf(" %d bytes", len(b))
		}
	case "list":
		var entries []os.DirEntry
		if entries, err = os.ReadDir(path); err == nil {
			names := make([]string, len(entries))
			for i, e := range entries {
				names[i] = e.Name()
			}
			detail = " " + strings.Join(names, ",")
		}
	case "write":
		err = os.WriteFile(path, []byte("probe"), 0o600)
	case "swap":
		link, target, _ := strings.Cut(path, ">")
		link = filepath.Clean(link)
		if err = os.Rename(link, link+".swapped"); errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err == nil {
			err = os.Symlink(target, link)
		}
	}
	switch {
	case err == nil:
		return ProbeOK(kind, path) + detail
	case errors.Is(err, os.ErrPermission):
		return ProbeFailed(kind, path) + " permission denied"
	case errors.Is(err, os.ErrNotExist):
		return ProbeFailed(kind, path) + " not found"
	default:
		return ProbeFailed(kind, path) + " " + err.Error()
	}
}
