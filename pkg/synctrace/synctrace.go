// Package synctrace records the synced writes a process makes — an fsync
// or fdatasync of a file, a PostgreSQL commit — when the environment
// variable TETHER_SYNC_TRACE names a directory: one JSON line per write,
// in <dir>/<program>-<pid>.jsonl, with the site, the run (when the site
// knows it) and the wall-clock start and end. tether-bench-stack sets it to
// print the synced writes on a warm turn's critical path from the sites
// themselves (SPEC P4), not from estimates. Unset (always, outside the
// bench), a site costs one atomic load.
package synctrace

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// EnvVar names the trace directory.
const EnvVar = "TETHER_SYNC_TRACE"

// Record is one synced write.
type Record struct {
	// Process is the program's base name (executor, runnergw, runnerd, …).
	Process string `json:"p"`
	// Site names the write, e.g. "executor.submit", "runnerd.intents".
	Site string `json:"s"`
	// Run is the run the write is made for, when the site knows it.
	Run string `json:"r,omitempty"`
	// Note says what was written, when the site knows (e.g. event types).
	Note string `json:"n,omitempty"`
	// Start and End are wall-clock Unix nanoseconds.
	Start int64 `json:"b"`
	End   int64 `json:"e"`
	// Step marks a record that is not a synced write: a step of the
	// critical path (Step), shown on the bench's timeline and never
	// counted as a synced write.
	Step bool `json:"t,omitempty"`
}

var (
	once    sync.Once
	enabled atomic.Bool
	mu      sync.Mutex
	out     *os.File
	program string
)

func open() {
	dir := os.Getenv(EnvVar)
	if dir == "" {
		return
	}
	program = filepath.Base(os.Args[0])
	f, err := os.OpenFile(filepath.Join(dir, program+"-"+strconv.Itoa(os.Getpid())+".jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	out = f
	enabled.Store(true)
}

// Begin starts timing a synced write at site for run ("" when unknown); the
// returned function ends it and records it.
func Begin(site, run string) func() { return BeginNote(site, run, nil) }

// BeginNote is Begin with a note computed only when tracing is on.
func BeginNote(site, run string, note func() string) func() {
	if !On() {
		return func() {}
	}
	start := time.Now()
	return func() {
		r := Record{Site: site, Run: run, Start: start.UnixNano(), End: time.Now().UnixNano()}
		if note != nil {
			r.Note = note()
		}
		write(r)
	}
}

// Step starts timing a step of a run's critical path that is not a synced
// write (e.g. "executor.route", "runnergw.open"); the returned function ends
// it. The bench prints steps on its timeline beside the synced writes, to
// show where the time between them goes.
func Step(site, run string) func() {
	if !On() {
		return func() {}
	}
	start := time.Now()
	return func() {
		write(Record{Site: site, Run: run, Start: start.UnixNano(), End: time.Now().UnixNano(), Step: true})
	}
}

// On reports whether this process traces its synced writes.
func On() bool {
	once.Do(open)
	return enabled.Load()
}

func write(r Record) {
	r.Process = program
	b, err := json.Marshal(r)
	if err != nil {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	_, _ = out.Write(append(b, '\n'))
}

// Types names n items by type (typ(i)) in order, with runs of one type
// folded ("item.delta×8"): a note for a batch of events or commands.
func Types(n int, typ func(i int) string) string {
	var b strings.Builder
	for i := 0; i < n; {
		j := i
		for j < n && typ(j) == typ(i) {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte('+')
		}
		b.WriteString(typ(i))
		if j-i > 1 {
			b.WriteString("×" + strconv.Itoa(j-i))
		}
		i = j
	}
	return b.String()
}

// Environ is the trace part of this process's environment, for a child
// process that should trace where this one does (nil when off).
func Environ() []string {
	if v := os.Getenv(EnvVar); v != "" {
		return []string{EnvVar + "=" + v}
	}
	return nil
}

// Read returns every record in dir's trace files.
func Read(dir string) ([]Record, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var recs []Record
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(f)
		for {
			var r Record
			if dec.Decode(&r) != nil {
				break
			}
			recs = append(recs, r)
		}
		f.Close()
	}
	return recs, nil
}
