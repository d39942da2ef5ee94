// Command backup-verifier verifies lease-bound backup stamps. Checkpoint
// upload, download, manifests and provider packs arrive with the backups
// issue; this first draft serves VerifyStamp.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	"github.com/tether-run/tether/pkg/grpcx"
	"github.com/tether-run/tether/pkg/keyfile"
	"github.com/tether-run/tether/services/backup/internal/stamp"
)

type server struct {
	backupv1.UnimplementedBackupVerifierServer
	key []byte
}

func (s *server) VerifyStamp(_ context.Context, req *backupv1.VerifyStampRequest) (*backupv1.VerifyStampResponse, error) {
	ok, reason := stamp.Verify(s.key, req.GetStamp(), req.GetLeaseId())
	return &backupv1.VerifyStampResponse{Valid: ok, Reason: reason}, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "backup-verifier:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("backup-verifier", flag.ExitOnError)
	cfg := grpcx.RegisterFlags(fs, "backup-verifier", "127.0.0.1:7402", "127.0.0.1:9402")
	home, _ := os.UserHomeDir()
	keyFile := grpcx.StringFlag(fs, "stamp-key-file", "", filepath.Join(home, ".local", "state", "tether", "backup", "stamp.key"),
		"HMAC key signing backup stamps (created 0600 when missing)")
	if err := grpcx.ParseFlags(fs, os.Args[1:]); err != nil {
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
	backupv1.RegisterBackupVerifierServer(srv.GRPC(), &server{key: key})
	ctx, stop := grpcx.SignalContext(context.Background())
	defer stop()
	return srv.Serve(ctx)
}
