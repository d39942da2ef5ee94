package codex

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// procStat is the part of /proc/<pid>/stat this package uses.
type procStat struct {
	State      byte
	PGRP       int
	StartTicks uint64
}

// parseProcStat parses the content of /proc/<pid>/stat. The second field
// (comm) is wrapped in parentheses and may itself contain spaces and
// parentheses, so the fields after it are located from the LAST ')'.
func parseProcStat(b []byte) (procStat, error) {
	var st procStat
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return st, errors.New("proc stat: no comm field")
	}
	rest := strings.Fields(string(b[end+1:]))
	// rest[0] is field 3 (state), so field N is rest[N-3].
	if len(rest) < 22-3+1 {
		return st, fmt.Errorf("proc stat: %d fields after comm, want at least %d", len(rest), 22-3+1)
	}
	if len(rest[0]) != 1 {
		return st, fmt.Errorf("proc stat: bad state %q", rest[0])
	}
	st.State = rest[0][0]
	pgrp, err := strconv.Atoi(rest[5-3])
	if err != nil {
		return st, fmt.Errorf("proc stat: bad pgrp: %w", err)
	}
	st.PGRP = pgrp
	ticks, err := strconv.ParseUint(rest[22-3], 10, 64)
	if err != nil {
		return st, fmt.Errorf("proc stat: bad starttime: %w", err)
	}
	st.StartTicks = ticks
	return st, nil
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

// ProcStartTicks returns the start time of process pid in clock ticks since
// boot (/proc/<pid>/stat field 22). Compare it with ProcessInfo.StartTicks to
// tell a live recorded process from an unrelated one that reused its PID.
func ProcStartTicks(pid int) (uint64, error) {
	st, err := readProcStat(pid)
	if err != nil {
		return 0, err
	}
	return st.StartTicks, nil
}

// ---- stderr capture ----

const (
	stderrRingLines = 64
	stderrLineMax   = 512
)

// stderrRing keeps the last stderrRingLines (redacted, truncated) stderr
// lines, so memory stays bounded however much the provider writes.
type stderrRing struct {
	mu    sync.Mutex
	lines []string
	next  int
	full  bool
}

func (r *stderrRing) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lines == nil {
		r.lines = make([]string, stderrRingLines)
	}
	r.lines[r.next] = line
	r.next = (r.next + 1) % stderrRingLines
	if r.next == 0 {
		r.full = true
	}
}

func (r *stderrRing) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lines == nil {
		return nil
	}
	if !r.full {
		return append([]string(nil), r.lines[:r.next]...)
	}
	out := make([]string, 0, stderrRingLines)
	out = append(out, r.lines[r.next:]...)
	return append(out, r.lines[:r.next]...)
}

// readBoundedLines calls fn with each line of rd (without the newline),
// truncated to max bytes; the rest of an overlong line is discarded without
// being buffered.
func readBoundedLines(rd io.Reader, max int, fn func(line []byte, truncated bool)) {
	br := bufio.NewReaderSize(rd, 4096)
	line := make([]byte, 0, max)
	truncated := false
	for {
		chunk, err := br.ReadSlice('\n')
		take := chunk
		if room := max - len(line); len(take) > room {
			if room < 0 {
				room = 0
			}
			if len(bytes.TrimRight(take[room:], "\r\n")) > 0 {
				truncated = true
			}
			take = take[:room]
		}
		line = append(line, take...)
		switch {
		case err == nil:
			fn(bytes.TrimRight(line, "\r\n"), truncated)
			line, truncated = line[:0], false
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			if len(line) > 0 {
				fn(bytes.TrimRight(line, "\r\n"), truncated)
			}
			return
		}
	}
}

var (
	ansiEscape   = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]`)
	bearerToken  = regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+`)
	skToken      = regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{6,}`)
	secretAssign = regexp.MustCompile(`(?i)\b([A-Z0-9_]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)[A-Z0-9_]*)(\s*[=:]\s*)("[^"]*"|'[^']*'|\S+)`)
	controlChars = regexp.MustCompile(`[\x00-\x08\x0b-\x1f\x7f]`)
)

// sanitizeLogLine strips terminal escapes and control characters and masks
// things that look like credentials before a provider line reaches a log.
func sanitizeLogLine(s string) string {
	s = ansiEscape.ReplaceAllString(s, "")
	s = controlChars.ReplaceAllString(s, "")
	s = bearerToken.ReplaceAllString(s, "${1}[REDACTED]")
	s = skToken.ReplaceAllString(s, "[REDACTED]")
	s = secretAssign.ReplaceAllString(s, "${1}${2}[REDACTED]")
	return s
}
