// Package atomicfile writes private files crash-safely: a temporary sibling
// with an unpredictable name, fsync, rename over the target, fsync of the
// directory. A reader sees the old content or the new, never a torn file.
package atomicfile

import (
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/synctrace"
)

// Write replaces dir/name with data (mode perm).
func Write(dir, name string, data []byte, perm os.FileMode) error {
	defer synctrace.Begin("atomic "+name, "")()
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	ok = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory so renames and creations in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
