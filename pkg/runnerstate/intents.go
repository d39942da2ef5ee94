package runnerstate

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-run/tether/pkg/prp"
)

// IntentLogFile is the intent log's name inside the runner directory:
// runnerd appends each command's intent to it (one fdatasync for the
// commands received together) before any of their effects, and the
// outcomes of the warm path's commands before they are answered (an
// OutcomeBatch), until a saved state document covers them. The durable scope rules read it too: a
// run.attach journaled there binds its run to the scope (SPEC P4).
const IntentLogFile = "intents.log"

// CmdRunAttach is the command that attaches a run to the scope's runner.
const CmdRunAttach = prp.CommandRunAttach

// Intent is a command journaled as received, before any of its effects: the
// fields of its journal record while its outcome is pending.
type Intent struct {
	CommandID     string    `json:"commandId"`
	ControllerSeq uint64    `json:"controllerSeq"`
	CommandType   string    `json:"commandType"`
	RunID         string    `json:"runId,omitempty"`
	Attempt       uint64    `json:"attempt,omitempty"`
	Fingerprint   string    `json:"fingerprint"`
	ReceivedAt    time.Time `json:"receivedAt"`
	// Outcomes makes the line an outcome record: the outcomes of a batch
	// of commands that ran, journaled before they are answered (its intent
	// fields repeat the batch's last command's intent, so a reader that
	// looks for intents only sees that intent again).
	Outcomes *OutcomeBatch `json:"outcomes,omitempty"`
}

// OutcomeBatch is the outcome of a batch of commands, journaled in the
// intent log (one append, one fdatasync) before their answers are sent: the
// commands' final records and the state they left that a restart cannot
// read back from the outbox or the provider. The state document catches up
// later; it covers the outcome records up to its lastOutcomeSeq, and a
// restart applies the later ones over it (ApplyOutcomes).
type OutcomeBatch struct {
	Seq      uint64           `json:"seq"`
	Commands []*CommandRecord `json:"commands"`
	// The commands' effects on the state, as they left it.
	CurrentRun   *RunRef         `json:"currentRun,omitempty"`
	SessionInput json.RawMessage `json:"sessionInput,omitempty"`
	ActiveTurn   *Turn           `json:"activeTurn,omitempty"`
	LastTurnID   string          `json:"lastTurnId,omitempty"`
}

// ApplyOutcomes puts an outcome record the state does not cover (its seq is
// after st.LastOutcomeSeq) into st: the commands' records and the state
// they left. It reports whether it applied b.
func (st *State) ApplyOutcomes(b *OutcomeBatch) bool {
	if b == nil || b.Seq <= st.LastOutcomeSeq {
		return false
	}
	st.LastOutcomeSeq = b.Seq
	if st.ProcessedCommands == nil {
		st.ProcessedCommands = CommandJournal{}
	}
	for _, rec := range b.Commands {
		if rec == nil || rec.CommandID == "" {
			continue
		}
		c := *rec
		c.encoded = nil
		st.ProcessedCommands[c.CommandID] = &c
		st.LastControllerCommandSeq = max(st.LastControllerCommandSeq, c.ControllerSeq)
	}
	if b.CurrentRun != nil {
		st.CurrentRun = b.CurrentRun
	}
	if len(b.SessionInput) > 0 {
		st.SessionInput = b.SessionInput
	}
	st.ActiveTurn = b.ActiveTurn
	if b.LastTurnID != "" {
		st.LastTurnID = b.LastTurnID
	}
	return true
}

// ApplyIntentLog reads an intent log (raw, as ParseIntents) over st as a
// restarted runnerd does: the outcome records st does not cover are applied
// (ApplyOutcomes), and the intents of commands still without an outcome —
// journaled after everything st then covers — are returned: their
// commands were in flight. A reader of a dead runner's state that is not
// runnerd (the gateway's durable scope rules) sees what runnerd will.
func (st *State) ApplyIntentLog(raw []byte) (pending []Intent) {
	ins := ParseIntents(raw)
	for _, in := range ins {
		if in.Outcomes != nil {
			st.ApplyOutcomes(in.Outcomes)
		}
	}
	for _, in := range ins {
		if in.Outcomes == nil && in.ControllerSeq > st.LastControllerCommandSeq {
			pending = append(pending, in)
		}
	}
	return pending
}

// The append-only logs (outbox.log, intents.log) hold one frame per line:
// "<crc32c hex of the JSON> <JSON>\n". A torn or corrupt tail (a crash
// during an append) ends what is read.

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// AppendFrame writes v's frame to buf.
func AppendFrame(buf *bytes.Buffer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	fmt.Fprintf(buf, "%08x ", crc32.Checksum(body, crcTable))
	buf.Write(body)
	buf.WriteByte('\n')
	return nil
}

// Unframe decodes one whole, intact frame into v.
func Unframe(line []byte, v any) bool {
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

// DecodeIntent decodes one intent log line.
func DecodeIntent(line []byte) (Intent, bool) {
	var in Intent
	if !Unframe(line, &in) || in.CommandID == "" || in.ControllerSeq == 0 {
		return Intent{}, false
	}
	return in, true
}

// ParseIntents returns the intents of an intent log's bytes, up to a torn
// or corrupt line.
func ParseIntents(b []byte) []Intent {
	var ins []Intent
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		in, ok := DecodeIntent(b[:i+1])
		if !ok {
			break
		}
		ins = append(ins, in)
		b = b[i+1:]
	}
	return ins
}

// OutboxFile is runnerd's event outbox inside the runner directory.
const OutboxFile = "outbox.log"

// ProducedThrough is the highest source seq the runner whose state root is
// stateRoot produced: the state document's cursors, or the newest intact
// record of its outbox when that is newer (runnerd journals events before
// the document catches up). It orders a root against what the executor
// holds from the same runner instance (SPEC F9, R13): a root that produced
// at least that much is not older. ok is false without a readable state
// document.
func ProducedThrough(stateRoot string) (st *State, produced uint64, ok bool) {
	raw, err := os.ReadFile(Path(stateRoot))
	if err != nil {
		return nil, 0, false
	}
	if st, err = Decode(raw); err != nil {
		return nil, 0, false
	}
	produced = st.AckedSourceSeq
	if st.NextSourceSeq > 0 {
		produced = max(produced, st.NextSourceSeq-1)
	}
	if b, err := os.ReadFile(filepath.Join(stateRoot, Dir, OutboxFile)); err == nil {
		for len(b) > 0 {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				break
			}
			var rec struct {
				SourceSeq uint64 `json:"sourceSeq"`
			}
			if !Unframe(b[:i+1], &rec) {
				break
			}
			produced = max(produced, rec.SourceSeq)
			b = b[i+1:]
		}
	}
	return st, produced, true
}
