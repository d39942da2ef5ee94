package confine

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// HandOver makes root and everything below it owned by uid:gid and root
// itself mode 0700. It walks by directory descriptors without following
// symbolic links at any level (a runner of the same company could swap a
// directory for a link while the walk runs), changes a link itself rather
// than its target, and leaves alone a regular file with more than one link
// that is not already the uid's (a hard link to a file of the gateway's).
func HandOver(root string, uid, gid int) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: root, Err: err}
	}
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			return &os.PathError{Op: "chown", Path: root, Err: err}
		}
	}
	if st.Mode&0o7777 != 0o700 {
		if err := unix.Fchmod(fd, 0o700); err != nil {
			return &os.PathError{Op: "chmod", Path: root, Err: err}
		}
	}
	return handOverDir(fd, root, uid, gid)
}

func handOverDir(dirfd int, path string, uid, gid int) error {
	dup, err := unix.Dup(dirfd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		p := path + "/" + name
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return &os.PathError{Op: "stat", Path: p, Err: err}
		}
		mine := int(st.Uid) == uid && int(st.Gid) == gid
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return &os.PathError{Op: "open", Path: p, Err: err}
			}
			if !mine {
				err = unix.Fchown(sub, uid, gid)
			}
			if err == nil {
				err = handOverDir(sub, p, uid, gid)
			}
			unix.Close(sub)
			if err != nil {
				return err
			}
			continue
		}
		if mine || (st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1) {
			continue
		}
		if err := unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "chown", Path: p, Err: err}
		}
	}
	return nil
}
