// Command backup-verifier serves tether.backup.v1.BackupVerifier: checkpoint
// upload and download, quick and deep backup verification, lease-bound
// stamps and provider-pack verification. Archives go to a blob store
// (-blob-url: a local directory by default, or any gocloud.dev/blob URL such
// as s3:// or gs://), metadata to PostgreSQL (-database-url, schema backup).
// Without a database the service still verifies stamp signatures and
// provider packs; checkpoint RPCs then answer FailedPrecondition
// backup_metadata_disabled.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/envflag"
	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/identity"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/pgstore/migratecli"
	"github.com/tether-run/tether/services/backup/internal/api"
	"github.com/tether-run/tether/services/backup/internal/checkpoint"
	"github.com/tether-run/tether/services/backup/internal/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "backup-verifier:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		return migratecli.Run("backup-verifier", os.Args[2:], store.Schema)
	}
	fs := flag.NewFlagSet("backup-verifier", flag.ExitOnError)
	cfg := grpcx.RegisterFlags(fs, "backup-verifier", "127.0.0.1:7402", "127.0.0.1:9402")
	// SPEC S2: over mTLS only gateways and executors may call the verifier.
	cfg.AllowedPeers = []string{identity.Executor, identity.Gateway}
	home, _ := os.UserHomeDir()
	state := filepath.Join(home, ".local", "state", "tether", "backup")
	keyFile := envflag.String(fs, "stamp-key-file", "", filepath.Join(state, "stamp.key"),
		"HMAC key signing backup stamps (created 0600 when missing)")
	dsn := envflag.String(fs, "database-url", "", "",
		"PostgreSQL URL for checkpoint metadata (schema backup); empty: checkpoints disabled")
	migrate := envflag.Bool(fs, "migrate", "", true, "apply database migrations at start (under a lock); false: only check that the schema has every migration this verifier needs and refuse to start otherwise (run `backup-verifier migrate` first)")
	blobURL := envflag.String(fs, "blob-url", "", "file://"+filepath.Join(state, "blobs")+"?create_dir=true",
		"blob store for checkpoint archives (gocloud.dev/blob URL: file:///dir, s3://bucket, gs://bucket)")
	staging := envflag.String(fs, "staging-dir", "", filepath.Join(state, "staging"),
		"private directory where uploads are checked and staged (created 0700; refused when a symlink, another user's or writable by others)")
	maxArchive := envflag.Int(fs, "max-archive-bytes", "", archive.DefaultMaxArchiveBytes, "largest archive accepted, as transferred")
	maxExpanded := envflag.Int(fs, "max-expanded-bytes", "", archive.DefaultMaxExpandedBytes, "largest total of file sizes an archive may expand to")
	maxEntries := envflag.Int(fs, "max-entries", "", archive.DefaultMaxEntries, "most entries an archive may hold")
	packRoots := envflag.String(fs, "provider-pack-root", "",
		"/opt/tether/provider-pack,"+filepath.Join(home, ".local", "share", "tether", "provider-pack"),
		"comma-separated directories VerifyProviderPack may read (a pack root must be one of them or below one)")
	if err := envflag.Parse(fs, os.Args[1:]); err != nil {
		return err
	}
	key, err := keyfile.LoadOrCreate(*keyFile)
	if err != nil {
		return err
	}
	srv, err := grpcx.New(*cfg)
	if err != nil {
		return err
	}
	log := srv.Logger()
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	stopTracing, err := cfg.StartTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()

	svc := &checkpoint.Service{
		Key: key, StagingDir: *staging, Log: log, Metrics: checkpoint.NewMetrics(srv.Registry()),
		Limits: archive.Limits{MaxArchiveBytes: int64(*maxArchive), MaxExpandedBytes: int64(*maxExpanded), MaxEntries: *maxEntries},
	}
	if err := svc.PrepareStaging(*staging); err != nil {
		return err
	}
	if *dsn == "" {
		log.Warn("no -database-url (TETHER_DATABASE_URL): checkpoint metadata disabled; UploadCheckpoint, DownloadCheckpoint " +
			"and VerifyBackup answer " + failure.BackupMetadataDisabled + ", VerifyStamp answers valid=false; VerifyProviderPack works")
	} else {
		if *migrate {
			if err := store.Migrate(ctx, *dsn); err != nil {
				return fmt.Errorf("migrating: %w", err)
			}
		} else if err := store.CheckSchema(ctx, *dsn); err != nil {
			return err
		}
		st, err := store.Open(ctx, *dsn)
		if err != nil {
			return err
		}
		defer st.Close()
		bucket, err := blob.OpenBucket(ctx, checkpoint.BucketURL(*blobURL))
		if err != nil {
			return fmt.Errorf("opening blob store %s: %w", *blobURL, err)
		}
		defer bucket.Close()
		svc.Store, svc.Bucket = st, bucket
		// Ready only while the metadata database answers (SPEC D5).
		srv.AddReadinessCheck("database", st.Ping)
		srv.Registry().MustRegister(pgstore.PoolCollector(map[string]*pgxpool.Pool{"main": st.Pool()}))
		log.Info("checkpoints enabled", "blob_url", redact(*blobURL))
	}
	var roots []string
	for r := range strings.SplitSeq(*packRoots, ",") {
		if r = strings.TrimSpace(r); r != "" {
			roots = append(roots, filepath.Clean(r))
		}
	}
	backupv1.RegisterBackupVerifierServer(srv.GRPC(), &api.Server{Svc: svc, PackRoots: roots})
	return srv.Serve(ctx)
}

// redact drops a URL's query (it may carry credentials).
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i]
	}
	return u
}
