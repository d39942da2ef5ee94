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
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/gcsblob"
	_ "gocloud.dev/blob/s3blob"

	"github.com/tether-run/tether/pkg/failure"
	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/pkg/pgstore"
	"github.com/tether-run/tether/pkg/pgstore/migratecli"
	"github.com/tether-run/tether/services/backup/internal/api"
	"github.com/tether-run/tether/services/backup/internal/checkpoint"
	"github.com/tether-run/tether/services/backup/internal/config"
	"github.com/tether-run/tether/services/backup/internal/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "backup-verifier:", err)
		os.Exit(1)
	}
}

// run is flags → config → wiring → serving.
func run() error {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		return migratecli.Run("backup-verifier", os.Args[2:], store.Schema)
	}
	cfg, err := config.Load(os.Args[1:])
	if err != nil {
		return err
	}
	key, err := keyfile.LoadOrCreate(cfg.StampKeyFile)
	if err != nil {
		return err
	}
	srv, err := grpcx.New(*cfg.Server)
	if err != nil {
		return err
	}
	log := srv.Logger()
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	stopTracing, err := cfg.Server.StartTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	svc := &checkpoint.Service{
		Key: key, StagingDir: cfg.StagingDir, Log: log, Metrics: checkpoint.NewMetrics(srv.Registry()), Limits: cfg.Limits,
	}
	if err := svc.PrepareStaging(cfg.StagingDir); err != nil {
		return err
	}
	closeStores, err := openStores(ctx, cfg, svc, srv)
	if err != nil {
		return err
	}
	defer closeStores()
	backupv1.RegisterBackupVerifierServer(srv.GRPC(), &api.Server{Svc: svc, PackRoots: cfg.PackRoots})
	return srv.Serve(ctx)
}

// openStores opens the metadata database and the blob store into svc when
// a database is configured (else checkpoints are disabled, and said so).
// The returned function closes them.
func openStores(ctx context.Context, cfg *config.Config, svc *checkpoint.Service, srv *grpcx.Server) (func(), error) {
	log := srv.Logger()
	if cfg.DatabaseURL == "" {
		log.Warn("no -database-url (TETHER_DATABASE_URL): checkpoint metadata disabled; UploadCheckpoint, DownloadCheckpoint " +
			"and VerifyBackup answer " + failure.BackupMetadataDisabled + ", VerifyStamp answers valid=false; VerifyProviderPack works")
		return func() {}, nil
	}
	if cfg.Migrate {
		if err := store.Migrate(ctx, cfg.DatabaseURL); err != nil {
			return nil, fmt.Errorf("migrating: %w", err)
		}
	} else if err := store.CheckSchema(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	bucket, err := blob.OpenBucket(ctx, checkpoint.BucketURL(cfg.BlobURL))
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("opening blob store %s: %w", cfg.BlobURL, err)
	}
	svc.Store, svc.Bucket = st, bucket
	// Ready only while the metadata database answers (SPEC D5).
	srv.AddReadinessCheck("database", st.Ping)
	srv.Registry().MustRegister(pgstore.PoolCollector(map[string]*pgxpool.Pool{"main": st.Pool()}))
	log.Info("checkpoints enabled", "blob_url", redact(cfg.BlobURL))
	return func() { _ = bucket.Close(); st.Close() }, nil
}

// redact drops a URL's query (it may carry credentials).
func redact(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i]
	}
	return u
}
