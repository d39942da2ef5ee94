package statedir

import (
	"io"
	"os"
)

// The append-only logs (outbox.log, intents.log) hold one frame per line
// (runnerstate.AppendFrame). A torn or corrupt tail (a crash during an
// append) is dropped when the log is opened.

// truncateTail cuts f after off (the end of its last intact frame), durably
// when there was anything after it, and positions f there for appends. It
// returns how many bytes were dropped.
func truncateTail(f *os.File, off int64) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	dropped := fi.Size() - off
	if dropped > 0 {
		if err := f.Truncate(off); err != nil {
			return 0, err
		}
		if err := f.Sync(); err != nil {
			return 0, err
		}
	}
	_, err = f.Seek(off, io.SeekStart)
	return max(dropped, 0), err
}
