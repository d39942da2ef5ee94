package statedir

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/tether-run/tether/pkg/runnerstate"
	"github.com/tether-run/tether/pkg/synctrace"
)

// OutboxFile is the outbox log's name inside the runner directory.
const OutboxFile = runnerstate.OutboxFile

// compactMinBytes is the file size from which acknowledged records are
// compacted away.
const compactMinBytes = 1 << 20

// Record is one journaled event. Envelope is the exact protojson encoding of
// the event, resent byte for byte on replay.
type Record struct {
	SourceSeq uint64          `json:"sourceSeq"`
	Priority  uint32          `json:"priority"`
	EventType string          `json:"eventType"`
	Envelope  json.RawMessage `json:"envelope"`
	// ProviderCursor, when set, is the provider host seq through which
	// every provider line's events are journaled (with this record).
	ProviderCursor uint64 `json:"providerCursor,omitempty"`
	// BatchEnd marks the last record of an Append. A batch is written
	// with one write, which a kill -9 can cut between pages: records of a
	// batch whose end is missing were never fsynced nor sent, and their
	// batch's provider cursor (on its last record) was lost with it — kept,
	// they would be sent and the provider lines behind them replayed and
	// journaled again (the same deltas twice). load drops them.
	BatchEnd bool `json:"batchEnd,omitempty"`
}

// Outbox is an append-only log of events not yet acknowledged. Each line is
// "<crc32c hex> <record JSON>\n"; a torn or corrupt tail (a crash during an
// append) is truncated on open.
type Outbox struct {
	dir   string
	f     *os.File
	size  int64 // bytes in the file
	dead  int64 // bytes of acknowledged records still in the file
	recs  []Record
	sizes []int64 // line size of each live record
	bytes uint64  // envelope bytes of live records
	last  uint64  // highest seq ever appended (survives trims)
	// cursor is the highest ProviderCursor in the file or appended since.
	cursor uint64
	// BeforeSync, when set, runs after a write and before its fdatasync (tests).
	BeforeSync func()
	// AfterSync, when set, runs after an append's fdatasync (tests).
	AfterSync func([]Record)
}

// OpenOutbox opens (creating) dir/outbox.log, drops a torn tail (a torn or
// corrupt line, and the records of a batch whose end is missing) and keeps
// the records with a source seq above acked.
func OpenOutbox(dir string, acked uint64) (*Outbox, int64, error) {
	path := filepath.Join(dir, OutboxFile)
	if fi, err := os.Lstat(path); err == nil && !fi.Mode().IsRegular() {
		return nil, 0, fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return nil, 0, err
	}
	o := &Outbox{dir: dir, f: f}
	dropped, err := o.load(acked)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if err := SyncDir(dir); err != nil {
		f.Close()
		return nil, 0, err
	}
	return o, dropped, nil
}

// load scans the log; it returns the number of torn bytes truncated.
func (o *Outbox) load(acked uint64) (int64, error) {
	if _, err := o.f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	br := bufio.NewReaderSize(o.f, 64<<10)
	type line struct {
		rec Record
		n   int64
	}
	var lines []line
	var last uint64
	ended, marked := 0, false // lines up to the last batch end; whether any batch end was seen
	for {
		b, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if len(b) == 0 {
			break
		}
		rec, ok := decodeLine(b)
		if !ok || (!rec.isCursor() && last != 0 && rec.SourceSeq <= last) {
			break // torn or corrupt tail: everything from here is dropped
		}
		if !rec.isCursor() {
			last = rec.SourceSeq
		}
		lines = append(lines, line{rec, int64(len(b))})
		if rec.BatchEnd {
			ended, marked = len(lines), true
		}
		if err != nil {
			break
		}
	}
	if marked {
		// The records after the last batch end belong to a batch cut
		// short. (A log written before batch ends were marked has none.)
		lines = lines[:ended]
	}
	var off int64
	for _, l := range lines {
		rec := l.rec
		o.cursor = max(o.cursor, rec.ProviderCursor)
		if rec.isCursor() {
			o.dead += l.n
			off += l.n
			continue
		}
		o.last = rec.SourceSeq
		if rec.SourceSeq > acked {
			o.recs = append(o.recs, rec)
			o.sizes = append(o.sizes, l.n)
			o.bytes += uint64(len(rec.Envelope))
		} else {
			o.dead += l.n
		}
		off += l.n
	}
	dropped, err := truncateTail(o.f, off)
	if err != nil {
		return 0, err
	}
	o.size = off
	return dropped, nil
}

func decodeLine(line []byte) (Record, bool) {
	var rec Record
	if !runnerstate.Unframe(line, &rec) {
		return Record{}, false
	}
	if rec.isCursor() {
		return rec, true
	}
	if rec.SourceSeq == 0 || len(rec.Envelope) == 0 {
		return Record{}, false
	}
	return rec, true
}

// isCursor reports whether rec is a cursor record (see MarkCursor): no
// event, only a provider host cursor.
func (r Record) isCursor() bool {
	return r.SourceSeq == 0 && (len(r.Envelope) == 0 || string(r.Envelope) == "null") && r.ProviderCursor > 0 && r.BatchEnd
}

// MarkCursor journals that every provider line through cursor has had its
// events journaled, when no event carries it: a host mark that arrived
// after its line's events were appended (or for a line without events).
// Lost, the line would be replayed to a restarted runnerd and its events
// journaled again under new seqs. The record is written without an fsync:
// the provider host that replays lines outlives only a runnerd process
// (whose written bytes the kernel keeps), never the machine, and the next
// append's fsync covers it anyway. It is not sent and not live.
func (o *Outbox) MarkCursor(cursor uint64) error {
	if cursor <= o.cursor {
		return nil
	}
	line, err := encodeLine(Record{ProviderCursor: cursor, BatchEnd: true})
	if err != nil {
		return err
	}
	if _, err := o.f.Write(line); err != nil {
		_ = o.f.Truncate(o.size)
		_, _ = o.f.Seek(o.size, io.SeekStart)
		return err
	}
	o.size += int64(len(line))
	o.dead += int64(len(line))
	o.cursor = cursor
	return nil
}

func encodeLine(rec Record) ([]byte, error) {
	var buf bytes.Buffer
	if err := runnerstate.AppendFrame(&buf, rec); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Append writes recs (ascending seqs above every earlier one) and syncs
// them (fdatasync) once before returning: a record is durable before anyone may send it.
func (o *Outbox) Append(recs ...Record) error {
	if len(recs) == 0 {
		return nil
	}
	defer synctrace.BeginNote("runnerd.outbox", "", func() string {
		return synctrace.Types(len(recs), func(i int) string { return recs[i].EventType })
	})()
	recs = append([]Record(nil), recs...)
	recs[len(recs)-1].BatchEnd = true
	var buf bytes.Buffer
	sizes := make([]int64, len(recs))
	last := o.last
	for i, r := range recs {
		if r.SourceSeq <= last {
			return fmt.Errorf("outbox: source seq %d does not follow %d", r.SourceSeq, last)
		}
		last = r.SourceSeq
		line, err := encodeLine(r)
		if err != nil {
			return err
		}
		sizes[i] = int64(len(line))
		buf.Write(line)
	}
	if _, err := o.f.Write(buf.Bytes()); err != nil {
		// Leave no half record behind for the next append.
		_ = o.f.Truncate(o.size)
		_, _ = o.f.Seek(o.size, io.SeekStart)
		return err
	}
	if o.BeforeSync != nil {
		o.BeforeSync()
	}
	// fdatasync, as the intent log: an append changes the file's size,
	// which fdatasync makes durable with the data (what a read after a
	// crash needs); it skips only the timestamps' journal write, ≈ 0.1 ms
	// of each append on this disk (0.25 vs 0.34 ms for 2 KiB), twice on a
	// warm turn's path (turn.started's batch, the terminal's).
	if err := fdatasync(o.f); err != nil {
		return err
	}
	o.size += int64(buf.Len())
	o.last = last
	for _, r := range recs {
		o.cursor = max(o.cursor, r.ProviderCursor)
	}
	o.recs = append(o.recs, recs...)
	o.sizes = append(o.sizes, sizes...)
	for _, r := range recs {
		o.bytes += uint64(len(r.Envelope))
	}
	if o.AfterSync != nil {
		o.AfterSync(recs)
	}
	return nil
}

// Trim forgets records with seq <= acked and compacts the file atomically
// once enough of it is dead.
func (o *Outbox) Trim(acked uint64) error {
	o.Forget(acked)
	if o.CompactDue() {
		return o.Compact()
	}
	return nil
}

// Forget drops the records with seq <= acked from the live set; their
// lines stay in the file (dead bytes) until Compact.
func (o *Outbox) Forget(acked uint64) {
	i := 0
	for i < len(o.recs) && o.recs[i].SourceSeq <= acked {
		o.dead += o.sizes[i]
		o.bytes -= uint64(len(o.recs[i].Envelope))
		i++
	}
	if i > 0 {
		o.recs = append([]Record(nil), o.recs[i:]...)
		o.sizes = append([]int64(nil), o.sizes[i:]...)
	}
}

// CompactDue reports whether enough of the file is dead to compact it.
func (o *Outbox) CompactDue() bool {
	return o.size >= compactMinBytes && o.dead*2 >= o.size
}

// Compact rewrites the log with only the live records (temp sibling, fsync,
// rename, dir fsync) and reopens it for appends. The provider host cursor
// survives it: when no live record carries it, a cursor record ends the
// log (the acknowledged records that carried it are gone).
func (o *Outbox) Compact() error {
	var buf bytes.Buffer
	var carried uint64
	for _, r := range o.recs {
		line, err := encodeLine(r)
		if err != nil {
			return err
		}
		buf.Write(line)
		carried = max(carried, r.ProviderCursor)
	}
	dead := int64(0)
	if o.cursor > carried {
		line, err := encodeLine(Record{ProviderCursor: o.cursor, BatchEnd: true})
		if err != nil {
			return err
		}
		buf.Write(line)
		dead = int64(len(line))
	}
	if err := WriteFileAtomic(o.dir, OutboxFile, buf.Bytes()); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(o.dir, OutboxFile), os.O_RDWR, fileMode)
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return err
	}
	_ = o.f.Close()
	o.f = f
	o.size = int64(buf.Len())
	o.dead = dead
	return nil
}

// After returns the live records with seq > after, in order.
func (o *Outbox) After(after uint64) []Record {
	for i, r := range o.recs {
		if r.SourceSeq > after {
			return append([]Record(nil), o.recs[i:]...)
		}
	}
	return nil
}

// ProviderCursor is the highest provider host cursor journaled in the log
// (0 if none).
func (o *Outbox) ProviderCursor() uint64 { return o.cursor }

// LastSeq is the highest seq ever appended (0 if none).
func (o *Outbox) LastSeq() uint64 { return o.last }

// Len is the number of live records.
func (o *Outbox) Len() int { return len(o.recs) }

// Bytes is the envelope size of the live records.
func (o *Outbox) Bytes() uint64 { return o.bytes }

// FileSize is the current size of the log file.
func (o *Outbox) FileSize() int64 { return o.size }

// Close closes the log file.
func (o *Outbox) Close() error { return o.f.Close() }
