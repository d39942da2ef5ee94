//go:build !unix

package digest

import (
	"errors"
	"os"
)

var errUnsupported = errors.New("digest: tree digests need a unix platform")

// BackupTree is not available on this platform.
func BackupTree(string, ...Options) (Result, error) { return Result{}, errUnsupported }

// PackTree is not available on this platform.
func PackTree(string, ...Options) (string, error) { return "", errUnsupported }

func openNoFollow(path string) (*os.File, error) { return os.Open(path) }
