// Package providerpack reads and verifies a build-owned remote provider pack:
// a directory holding provider-pack.json = {schema, digest, payload} next to
// the pinned artifacts and the dist/ tree the OpenCode and ACPX bridges run
// from (SPEC B1).
//
// Read runs every check in this order and stops at the first failure; every
// failure is runner_remote_provider_artifact_incompatible with the message
// named here:
//
//  1. provider-pack.json is not one readable JSON object (at most 1 MiB,
//     no repeated keys) with a string schema, a string digest and an object
//     payload → "provider-pack.json is unreadable";
//  2. the schema, the exact pins, the ACPX profile digests, the target
//     (platform and architecture strings), the runner source revision
//     (40 hex digits, optionally "-dirty") or the distDigest format differ
//     → "provider pack pins or source revision do not match";
//  3. digest != "sha256:" + hex(sha256(canonical JSON of payload)) →
//     "provider pack manifest digest mismatch";
//  4. for each artifact in the order nodeCommand, productionLock,
//     opencodeCommand, opencodeExecutable, opencodeProxy, acpxSidecar: a
//     path that is empty, absolute, holds a backslash or a ".." component or
//     is not normalised → "invalid <label> path"; a path other than the
//     pinned one → "<label> path must be <pinned path>"; file bytes whose
//     "sha256:"+hex differs → "<label> digest mismatch";
//  5. the provider-pack tree digest of dist/ (pkg/digest.PackTree) differs
//     from distDigest → "provider dist tree digest mismatch" (any extra,
//     missing or changed file under dist/; a symlink or special file there
//     is "unsupported dist entry <path>");
//  6. bridgeDigest != "sha256:" + hex(sha256(opencodeProxy.sha256 + "\n" +
//     acpxSidecar.sha256 + "\n" + distDigest)) → "provider bridge digest
//     mismatch".
//
// With an expected target (Options), a different target.platform or
// target.architecture → "provider pack target does not match".
//
// Artifacts are opened through an os.Root of the pack directory: a symlink
// among them (node_modules/.bin entries often are) is followed only while it
// stays inside the pack.
package providerpack

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/tether-run/tether/pkg/digest"
	"github.com/tether-run/tether/pkg/failure"
)

// FileName is the manifest's name inside a pack directory.
const FileName = "provider-pack.json"

// Schema is the manifest schema written by tether builds. CompatSchema, the
// reference build's name for the same layout, is accepted too.
const (
	Schema       = "tether-runner/remote-provider-pack/v1"
	CompatSchema = "paperclip-runner/remote-provider-pack/v1"
)

// MaxManifestBytes bounds provider-pack.json.
const MaxManifestBytes = 1 << 20

// Pins are the exact provider versions this build runs.
var Pins = map[string]string{
	"nodeMinimum": "24.11.0",
	"codex":       "0.148.0",
	"opencode":    "1.18.17",
	"acpx":        "0.13.1",
	"claudeAcp":   "0.70.0",
	"codexAcp":    "1.6.2",
}

// ACPXProfileDigests are the pinned ACPX agent profile digests.
var ACPXProfileDigests = map[string]string{
	"claude": "sha256:9d73d1f0f121fb96cc8badb28c22d5bff02d8582eb2e40360a81c189e1b9422a",
	"codex":  "sha256:94049b3e3c3aee87de62703786e4fa81d031d7bd979f99bdf516d84f28791a79",
}

// Artifact is one pinned artifact of a pack.
type Artifact struct {
	// Name is the key in payload.artifacts.
	Name string
	// Label names it in messages.
	Label string
	// Path is the pinned path relative to the pack root.
	Path string
}

// Artifacts lists the pinned artifacts in verification order.
var Artifacts = []Artifact{
	{"nodeCommand", "provider Node", "node_modules/node/bin/node"},
	{"productionLock", "production lockfile", "pnpm-lock.yaml"},
	{"opencodeCommand", "OpenCode command", "node_modules/.bin/opencode"},
	{"opencodeExecutable", "OpenCode executable", "node_modules/opencode-ai/bin/opencode.exe"},
	{"opencodeProxy", "OpenCode proxy", "dist/cli/opencode-app-server-proxy.cjs"},
	{"acpxSidecar", "ACPX sidecar", "dist/cli/acpx-runtime-sidecar.cjs"},
}

var (
	revisionRE = regexp.MustCompile(`^[0-9a-f]{40}(-dirty)?$`)
)

// ArtifactRef is an artifact entry of the payload.
type ArtifactRef struct {
	Path   string
	SHA256 string
}

// Manifest is a parsed provider-pack.json.
type Manifest struct {
	Schema string
	// Digest is the manifest digest: the pack's authority digest.
	Digest               string
	Pins                 map[string]string
	Platform             string
	Architecture         string
	RunnerSourceRevision string
	DistDigest           string
	BridgeDigest         string
	ACPXProfileDigests   map[string]string
	Artifacts            map[string]ArtifactRef
	// Payload is the payload as parsed (the digest's input).
	Payload map[string]any
}

// Options tune Read.
type Options struct {
	// Platform and Architecture, when set, must equal the pack's target.
	Platform     string
	Architecture string
}

func fail(format string, args ...any) error {
	return failure.New(codes.FailedPrecondition, failure.RunnerRemoteProviderArtifactIncompatible, format, args...)
}

// Parse runs checks 1–3 on the bytes of provider-pack.json.
func Parse(data []byte) (*Manifest, error) {
	unreadable := fail("provider-pack.json is unreadable")
	if len(data) > MaxManifestBytes {
		return nil, unreadable
	}
	v, err := digest.ParseJSON(data)
	if err != nil {
		return nil, unreadable
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, unreadable
	}
	schema, ok1 := top["schema"].(string)
	dig, ok2 := top["digest"].(string)
	payload, ok3 := top["payload"].(map[string]any)
	if !ok1 || !ok2 || !ok3 {
		return nil, unreadable
	}
	m := &Manifest{Schema: schema, Digest: dig, Payload: payload, Artifacts: map[string]ArtifactRef{}}

	pinsMismatch := fail("provider pack pins or source revision do not match")
	if schema != Schema && schema != CompatSchema {
		return nil, pinsMismatch
	}
	var okPins, okProfiles bool
	m.Pins, okPins = exactStrings(payload["pins"], Pins)
	m.ACPXProfileDigests, okProfiles = exactStrings(payload["acpxProfileDigests"], ACPXProfileDigests)
	target, okTarget := payload["target"].(map[string]any)
	if okTarget {
		m.Platform, okTarget = target["platform"].(string)
		var okArch bool
		m.Architecture, okArch = target["architecture"].(string)
		okTarget = okTarget && okArch
	}
	var okRev, okDist bool
	m.RunnerSourceRevision, okRev = payload["runnerSourceRevision"].(string)
	m.DistDigest, okDist = payload["distDigest"].(string)
	if !okPins || !okProfiles || !okTarget || !okRev || !revisionRE.MatchString(m.RunnerSourceRevision) ||
		!okDist || !digest.Valid(m.DistDigest) {
		return nil, pinsMismatch
	}
	m.BridgeDigest, _ = payload["bridgeDigest"].(string)

	want, err := digest.CanonicalHash(payload)
	if err != nil || want != dig {
		return nil, fail("provider pack manifest digest mismatch")
	}
	arts, _ := payload["artifacts"].(map[string]any)
	for _, a := range Artifacts {
		entry, _ := arts[a.Name].(map[string]any)
		p, _ := entry["path"].(string)
		s, _ := entry["sha256"].(string)
		m.Artifacts[a.Name] = ArtifactRef{Path: p, SHA256: s}
	}
	return m, nil
}

// exactStrings reports whether v is an object whose keys and string values
// are exactly want's.
func exactStrings(v any, want map[string]string) (map[string]string, bool) {
	obj, ok := v.(map[string]any)
	if !ok || len(obj) != len(want) {
		return nil, false
	}
	out := make(map[string]string, len(obj))
	for k, w := range want {
		s, ok := obj[k].(string)
		if !ok || s != w {
			return nil, false
		}
		out[k] = s
	}
	return out, true
}

// Read reads provider-pack.json in root and runs every check (see the
// package documentation). It returns the verified manifest.
func Read(root string, opts ...Options) (*Manifest, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fail("provider-pack.json is unreadable")
	}
	defer r.Close()
	data, err := readRegular(r, FileName, MaxManifestBytes+1)
	if err != nil {
		return nil, fail("provider-pack.json is unreadable")
	}
	m, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if o.Platform != "" && o.Platform != m.Platform || o.Architecture != "" && o.Architecture != m.Architecture {
		return nil, fail("provider pack target does not match")
	}
	for _, a := range Artifacts {
		ref := m.Artifacts[a.Name]
		if !cleanRelative(ref.Path) {
			return nil, fail("invalid %s path", a.Label)
		}
		if ref.Path != a.Path {
			return nil, fail("%s path must be %s", a.Label, a.Path)
		}
		got, err := fileDigest(r, ref.Path)
		if err != nil || got != ref.SHA256 {
			return nil, fail("%s digest mismatch", a.Label)
		}
	}
	dist, err := digest.PackTree(filepath.Join(root, "dist"))
	if err != nil {
		var fe *failure.Error
		if errors.As(err, &fe) && strings.HasPrefix(fe.Message, "unsupported dist entry") {
			return nil, err
		}
		return nil, fail("provider dist tree digest mismatch")
	}
	if dist != m.DistDigest {
		return nil, fail("provider dist tree digest mismatch")
	}
	proxy, sidecar := m.Artifacts["opencodeProxy"].SHA256, m.Artifacts["acpxSidecar"].SHA256
	if m.BridgeDigest != BridgeDigest(proxy, sidecar, m.DistDigest) {
		return nil, fail("provider bridge digest mismatch")
	}
	return m, nil
}

// BridgeDigest is "sha256:" + hex(sha256(proxy + "\n" + sidecar + "\n" +
// dist)) over the prefixed digest strings.
func BridgeDigest(proxySHA, sidecarSHA, distDigest string) string {
	return digest.String(proxySHA + "\n" + sidecarSHA + "\n" + distDigest)
}

// cleanRelative: non-empty, relative, no backslash, normalised, no "..".
func cleanRelative(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || path.Clean(p) != p {
		return false
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".." {
			return false
		}
	}
	return true
}

func readRegular(r *os.Root, name string, limit int64) ([]byte, error) {
	f, err := r.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

func fileDigest(r *os.Root, name string) (string, error) {
	f, err := r.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", name)
	}
	h := sha256.New()
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
	}
	return digest.Prefix + hex.EncodeToString(h.Sum(nil)), nil
}
