package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// RootLockFile is the file under a state root that the gateway serving the
// root holds an exclusive lock on.
const RootLockFile = "runnergw.lock"

// LockStateRoot takes the state root for this process: two gateways on one
// root would each launch a runnerd for the same scope and both write its
// journal and provider home. The lock is an advisory flock, so it is gone
// with the process however it ends (kill -9 included) and a restarted
// gateway takes the root at once; the file names the holder's pid for the
// error another gateway gets. Release unlocks (the file stays).
func LockStateRoot(root string) (release func(), err error) {
	path := filepath.Join(root, RootLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state root %s: %w", root, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("state root %s is in use by another runnergw (pid %s); give each gateway its own -state-root",
				root, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("state root %s: lock: %w", root, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
