package durable

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// The append-only logs (outbox.log, intents.log) hold one frame per line:
// "<crc32c hex of the JSON> <JSON>\n". A torn or corrupt tail (a crash
// during an append) is dropped when the log is opened.

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// appendFrame writes v's frame to buf.
func appendFrame(buf *bytes.Buffer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Fprintf(buf, "%08x ", crc32.Checksum(body, crcTable))
	buf.Write(body)
	buf.WriteByte('\n')
	return nil
}

// unframe decodes one whole, intact frame into v.
func unframe(line []byte, v any) bool {
	if len(line) < 10 || line[len(line)-1] != '\n' || line[8] != ' ' {
		return false
	}
	sum, err := hex.DecodeString(string(line[:8]))
	if err != nil {
		return false
	}
	body := line[9 : len(line)-1]
	want := uint32(sum[0])<<24 | uint32(sum[1])<<16 | uint32(sum[2])<<8 | uint32(sum[3])
	if crc32.Checksum(body, crcTable) != want {
		return false
	}
	return json.Unmarshal(body, v) == nil
}

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
