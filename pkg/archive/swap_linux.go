package archive

import (
	"errors"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// swap exchanges staged and target atomically when target exists (the old
// tree ends up at staged, inside the staging directory that the caller
// removes), or renames staged to target without replacing anything.
func swap(staged, target, previous string) error {
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		err := unix.Renameat2(unix.AT_FDCWD, staged, unix.AT_FDCWD, target, unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
			return swapByRename(staged, target, previous)
		}
		return err
	}
	err := unix.Renameat2(unix.AT_FDCWD, staged, unix.AT_FDCWD, target, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		return swapByRename(staged, target, previous)
	}
	return err
}
