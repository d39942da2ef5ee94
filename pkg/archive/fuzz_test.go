package archive

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtract feeds arbitrary bytes to Extract (seed corpus in
// testdata/fuzz/FuzzExtract, written by internal/gencorpus). It must never
// panic, never write outside its directory, never create anything but
// directories and regular files, never leave a directory without owner rwx
// or with group/other write, and agree with Check on acceptance.
func FuzzExtract(f *testing.F) {
	f.Add([]byte{})
	f.Add(buildTar(&testing.T{}, 2, 10))
	lim := Limits{MaxArchiveBytes: 1 << 20, MaxExpandedBytes: 4 << 20, MaxEntries: 200}
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "x")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		_, extractErr := Extract(bytes.NewReader(data), dir, ExtractOptions{Limits: lim})
		_, checkErr := Check(bytes.NewReader(data), lim)
		if (extractErr == nil) != (checkErr == nil) {
			t.Fatalf("Extract: %v; Check: %v", extractErr, checkErr)
		}
		ents, err := os.ReadDir(parent)
		if err != nil || len(ents) != 1 {
			t.Fatalf("something escaped the extraction root: %v %v", ents, err)
		}
		err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if t := d.Type(); !t.IsDir() && !t.IsRegular() {
				return &fs.PathError{Op: "extract", Path: p, Err: fs.ErrInvalid}
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				return &fs.PathError{Op: "setid", Path: p, Err: fs.ErrPermission}
			}
			if d.IsDir() && p != dir && info.Mode().Perm() != SafeDirMode(info.Mode()) {
				// SPEC S4: owner rwx always (the staging tree stays
				// removable), never group or other write.
				return &fs.PathError{Op: "dirmode " + info.Mode().Perm().String(), Path: p, Err: fs.ErrPermission}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if extractErr == nil {
			if _, _, err := DigestTar(bytes.NewReader(data), lim); err != nil && !bytes.HasPrefix([]byte(err.Error()), []byte("runner_")) {
				t.Fatalf("DigestTar: %v", err)
			}
		}
	})
}
