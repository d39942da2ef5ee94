package checkpoint

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
)

func TestB1_BucketURLKeepsAFileStoresTemporaryFilesBesideIt(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"file:///var/lib/tether/blobs?create_dir=true", "file:///var/lib/tether/blobs?create_dir=true&no_tmp_dir=true"},
		{"file:///data/blobs", "file:///data/blobs?no_tmp_dir=true"},
		{"file:///data/blobs?no_tmp_dir=", "file:///data/blobs?no_tmp_dir="},
		{"s3://bucket?region=eu-west-1", "s3://bucket?region=eu-west-1"},
		{"gs://bucket", "gs://bucket"},
		{"::not a url", "::not a url"},
	} {
		require.Equal(t, c.want, BucketURL(c.in), c.in)
	}
	// The store works, and leaves no temporary file behind.
	dir := t.TempDir()
	ctx := context.Background()
	b, err := blob.OpenBucket(ctx, BucketURL("file://"+dir+"?create_dir=true"))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, b.WriteAll(ctx, "checkpoints/s/a.tar", []byte("archive"), nil))
	got, err := b.ReadAll(ctx, "checkpoints/s/a.tar")
	require.NoError(t, err)
	require.Equal(t, "archive", string(got))
	entries, err := os.ReadDir(filepath.Join(dir, "checkpoints", "s"))
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, []string{"a.tar", "a.tar.attrs"}, names)
}
