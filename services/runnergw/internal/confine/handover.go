package confine

import (
	"errors"
	"fmt"
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

// KeepScopeRoot gives a scope root the ownership layout of the UID modes
// (SPEC T7): root itself owned by the gateway's user and gid, mode 0710;
// each entry named in owned (runnerd's subtrees: its state, the provider
// homes, the workspace) handed over to uid:gid by HandOver, and each in
// need created first (0700) when missing; every other entry taken back by
// the gateway (its user and group, a directory 0700), links and
// hard-linked files included as HandOver treats them. It works by
// directory descriptor and follows no link: a link where one of the owned
// directories should be is an error (the runner could only have put it
// there under the layout this replaces), never followed.
func KeepScopeRoot(root string, uid int, owned, need []string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(fd)
	me, myGid := os.Geteuid(), os.Getegid()
	if err := unix.Fchown(fd, me, uid); err != nil {
		return &os.PathError{Op: "chown", Path: root, Err: err}
	}
	if err := unix.Fchmod(fd, 0o710); err != nil {
		return &os.PathError{Op: "chmod", Path: root, Err: err}
	}
	for _, name := range need {
		if err := unix.Mkdirat(fd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: root + "/" + name, Err: err}
		}
	}
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), root)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		mine := false
		for _, o := range owned {
			mine = mine || o == name
		}
		if mine {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%s/%s is a link or not a directory: a runner's subtree must be a real directory", root, name)
			}
			if err := handOverAt(fd, root, name, uid, uid, 0o700); err != nil {
				return err
			}
			continue
		}
		if err := handOverAt(fd, root, name, me, myGid, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// handOverAt hands dirfd's entry name over to uid:gid: a directory (opened
// without following a link) and everything below it, mode mode; anything
// else is changed itself (a link, not its target), a regular file with
// more than one link is left alone.
func handOverAt(dirfd int, dir, name string, uid, gid int, mode uint32) error {
	p := dir + "/" + name
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if int(st.Uid) == uid && int(st.Gid) == gid || st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
			return nil
		}
		if err := unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.ENOENT) {
			return &os.PathError{Op: "chown", Path: p, Err: err}
		}
		return nil
	}
	sub, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(sub)
	if int(st.Uid) != uid || int(st.Gid) != gid {
		if err := unix.Fchown(sub, uid, gid); err != nil {
			return &os.PathError{Op: "chown", Path: p, Err: err}
		}
	}
	if st.Mode&0o7777 != mode {
		if err := unix.Fchmod(sub, mode); err != nil {
			return &os.PathError{Op: "chmod", Path: p, Err: err}
		}
	}
	return handOverDir(sub, p, uid, gid)
}
