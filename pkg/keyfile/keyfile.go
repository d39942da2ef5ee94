// Package keyfile loads a service's secret key from a private file, creating
// it with random bytes on first use.
package keyfile

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Size is the length of a created key.
const Size = 32

// LoadOrCreate returns the key stored at path, creating the file (0600, its
// directory 0700) with Size random bytes when it does not exist. A key
// shorter than Size is refused.
func LoadOrCreate(path string) ([]byte, error) {
	for {
		if b, err := os.ReadFile(path); err == nil {
			if len(b) < Size {
				return nil, fmt.Errorf("%s: key must be at least %d bytes", path, Size)
			}
			return b, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		key := make([]byte, Size)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue // created concurrently: read theirs
		}
		if err != nil {
			return nil, err
		}
		_, werr := f.Write(key)
		serr := f.Sync()
		cerr := f.Close()
		if err := errors.Join(werr, serr, cerr); err != nil {
			return nil, err
		}
		return key, nil
	}
}
