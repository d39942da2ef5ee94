package buildinfo_test

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestL4_MakeImageIsReproducibleAndLabelledWithTheVersion (opt-in: make
// image-check, TETHER_IMAGE_TEST=1; it builds static binaries): two runs
// of scripts/image.sh on the same tree and base, in different temporary
// directories, write byte-identical archives, so docker load gives the
// same image id (the sha256 of the config); the config is created at
// SOURCE_DATE_EPOCH and labelled with the version and the commit.
func TestL4_MakeImageIsReproducibleAndLabelledWithTheVersion(t *testing.T) {
	if os.Getenv("TETHER_IMAGE_TEST") == "" {
		t.Skip("opt-in: make image-check (TETHER_IMAGE_TEST=1)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	dir := t.TempDir()
	// A tiny base rootfs stands for the debootstrap one: the check is about
	// what make image adds.
	base := filepath.Join(dir, "base.tar")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "fs", "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fs", "etc", "os-release"), []byte("ID=test\n"), 0o644))
	out, err := exec.Command("tar", "-C", filepath.Join(dir, "fs"), "--sort=name", "--mtime=@0", "--owner=0", "--group=0",
		"--numeric-owner", "-cf", base, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	build := func(n string) (string, string) {
		archive := filepath.Join(dir, n+".tar")
		cmd := exec.Command("bash", filepath.Join(root, "scripts", "image.sh"))
		cmd.Env = append(os.Environ(), "BASE_ROOTFS="+base, "OUT="+archive, "VERSION=v9.9.9-test",
			"IMAGE_CMDS=./services/executor/cmd/tetherctl", "TMPDIR="+t.TempDir())
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return archive, strings.TrimPrefix(lines[len(lines)-1], "image id: ")
	}
	a, idA := build("a")
	b, idB := build("b")
	require.Equal(t, idA, idB)
	require.Equal(t, fileSum(t, a), fileSum(t, b), "byte-identical archives")

	// The config the id names: its labels and creation time.
	f, err := os.Open(a)
	require.NoError(t, err)
	defer f.Close()
	tr := tar.NewReader(f)
	var config struct {
		Created string `json:"created"`
		Config  struct {
			Labels map[string]string
			User   string
		} `json:"config"`
	}
	found := false
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if h.Name == "./"+strings.TrimPrefix(idA, "sha256:")+".json" {
			raw, err := io.ReadAll(tr)
			require.NoError(t, err)
			sum := sha256.Sum256(raw)
			require.Equal(t, idA, "sha256:"+hex.EncodeToString(sum[:]))
			require.NoError(t, json.Unmarshal(raw, &config))
			found = true
		}
	}
	require.True(t, found, "the archive holds the config named by the id")
	require.Equal(t, "v9.9.9-test", config.Config.Labels["org.opencontainers.image.version"])
	rev, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	require.NoError(t, err)
	require.Equal(t, strings.TrimSpace(string(rev)), config.Config.Labels["org.opencontainers.image.revision"])
	require.Equal(t, config.Created, config.Config.Labels["org.opencontainers.image.created"])
	require.Equal(t, "10001:10001", config.Config.User)
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
