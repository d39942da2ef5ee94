package main

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tether-run/tether/pkg/prp"
	"github.com/tether-run/tether/pkg/synctrace"
)

// turnWindow is one measured stack turn: SubmitRun sent at t0, turn.started
// and run.terminal received by its WatchRun.
type turnWindow struct {
	t0, started, end time.Time
}

// providerProcess is the program whose synced writes are the provider's own
// (SPEC P4 counts the others).
const providerProcess = "fake-codex-app-server"

// syncedWrite is one traced write, relative to its turn's t0.
type syncedWrite struct {
	label      string
	site, note string
	start, end time.Duration
	provider   bool
	// step: not a synced write but a step of the critical path
	// (synctrace.Step), shown on the timeline and never counted.
	step bool
}

// turnWrites returns the synced writes (pkg/synctrace, recorded at the
// fsync/commit sites of every process of the stack) and the traced steps of
// the critical path that started within the turn, in order of their start.
func turnWrites(recs []synctrace.Record, w turnWindow) []syncedWrite {
	var out []syncedWrite
	for _, r := range recs {
		if r.Start < w.t0.UnixNano() || r.Start >= w.end.UnixNano() {
			continue
		}
		label := r.Process + " " + r.Site
		if r.Note != "" {
			label += " [" + r.Note + "]"
		}
		out = append(out, syncedWrite{label: label, site: r.Site, note: r.Note, start: time.Duration(r.Start - w.t0.UnixNano()),
			end: time.Duration(r.End - w.t0.UnixNano()), provider: r.Process == providerProcess, step: r.Step})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out
}

// chain counts the synced writes, other than the provider's, that end by
// until and follow one another: the most writes of ws none of which
// overlaps another (earliest end first). Writes that overlap run side by
// side and cost the turn one sync's time; so this is the count of synced
// writes on the critical path, at most.
func chain(ws []syncedWrite, until time.Duration) int {
	var own []syncedWrite
	for _, w := range ws {
		if !w.provider && !w.step && w.end <= until {
			own = append(own, w)
		}
	}
	sort.Slice(own, func(i, j int) bool { return own[i].end < own[j].end })
	n, free := 0, time.Duration(-1)
	for _, w := range own {
		if w.start >= free {
			n++
			free = w.end
		}
	}
	return n
}

// persistSite is the executor's commit of a batch of a run's events.
const persistSite = "executor.events"

// chainTo counts the synced writes on the critical path to the executor's
// commit of the event typ (what a watcher waits for): that commit and the
// chain of writes that ended before it started — a write still going when
// the commit began is not one it waited for. Without such a commit in ws,
// the chain of the writes that ended by until.
func chainTo(ws []syncedWrite, typ string, until time.Duration) int {
	for _, w := range ws {
		if w.site == persistSite && carries(w.note, typ) {
			return chain(ws, w.start) + 1
		}
	}
	return chain(ws, until)
}

// carries reports whether a synctrace note of event types (synctrace.Types:
// "a+b×3+c") names typ.
func carries(note, typ string) bool {
	for _, t := range strings.Split(note, "+") {
		if t, _, _ = strings.Cut(t, "×"); t == typ {
			return true
		}
	}
	return false
}

// reportSynced prints the synced-write timeline of the median turn and the
// median counts over every measured turn, with a BENCH line.
// It returns the median count of synced writes on the critical path to
// turn.started.
func reportSynced(dir string, turns []turnWindow, raw anchors) (int, error) {
	recs, err := synctrace.Read(dir)
	if err != nil {
		return 0, err
	}
	if len(recs) == 0 || len(turns) == 0 {
		return 0, fmt.Errorf("no synced writes traced in %s", dir)
	}
	var toEnd, toStarted, inTurn, provider []int
	for _, w := range turns {
		ws := turnWrites(recs, w)
		toEnd = append(toEnd, chainTo(ws, "run.terminal", w.end.Sub(w.t0)))
		toStarted = append(toStarted, chainTo(ws, prp.EventTurnStarted, w.started.Sub(w.t0)))
		p, own := 0, 0
		for _, x := range ws {
			switch {
			case x.step:
			case x.provider:
				p++
			default:
				own++
			}
		}
		inTurn = append(inTurn, own)
		provider = append(provider, p)
	}
	// The timeline of the turn whose end-to-end time is the median.
	idx := make([]int, len(turns))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool {
		return turns[idx[a]].end.Sub(turns[idx[a]].t0) < turns[idx[b]].end.Sub(turns[idx[b]].t0)
	})
	med := turns[idx[len(idx)/2]]
	fmt.Printf("\nsynced writes of the median turn (start → end after SubmitRun; * = the provider's own, · = a step, not a write):\n")
	printWrites(turnWrites(recs, med))
	fmt.Printf("    %8s             turn.started received\n", round(med.started.Sub(med.t0)))
	fmt.Printf("    %8s             run.terminal received\n", round(med.end.Sub(med.t0)))
	printMedianSteps(recs, turns, raw, "turns", "SubmitRun")
	cp, cs := medianInt(toEnd), medianInt(toStarted)
	// SPEC P4 counts the writes a turn waits for before it starts (its
	// first events persisted); each later batch of events adds the
	// runner's outbox fsync and the executor's commit again (R4, G4).
	fmt.Printf("synced writes on the critical path (median of %d turns, besides the provider's own): %d to turn.started (target ≤ 4), "+
		"%d to run.terminal; %d in the turn in all (concurrent ones included), the provider's own %d\n",
		len(turns), cs, cp, medianInt(inTurn), medianInt(provider))
	fmt.Printf("BENCH warm_turn_synced_writes to_turn_started=%d to_run_terminal=%d in_turn=%d provider=%d target=4 met=%t\n",
		cs, cp, medianInt(inTurn), medianInt(provider), cs <= 4)
	return cs, nil
}

func printWrites(ws []syncedWrite) {
	for _, x := range ws {
		mark := " "
		switch {
		case x.provider:
			mark = "*"
		case x.step:
			mark = "·"
		}
		fmt.Printf("  %s %8s → %8s  %s\n", mark, round(x.start), round(x.end), x.label)
	}
}

// reportCancelWrites prints the synced writes between CancelRun sent and
// its answer received, of the cancellation whose latency is the median.
func reportCancelWrites(dir string, cancels []turnWindow, raw anchors) error {
	recs, err := synctrace.Read(dir)
	if err != nil || len(cancels) == 0 {
		return err
	}
	s := append([]turnWindow(nil), cancels...)
	sort.Slice(s, func(a, b int) bool { return s[a].end.Sub(s[a].t0) < s[b].end.Sub(s[b].t0) })
	med := s[len(s)/2]
	fmt.Printf("\nsynced writes of the median cancellation (after CancelRun sent; * = the provider's own, · = a step, not a write):\n")
	printWrites(turnWrites(recs, med))
	fmt.Printf("    %8s             CancelRun answered (interrupt acknowledged)\n", round(med.end.Sub(med.t0)))
	// Where the tail goes (SPEC P2 is a p99): the p99 cancellation's
	// timeline, and each step's median over every cancellation.
	slow := s[min(max((len(s)*99+99)/100-1, 0), len(s)-1)]
	fmt.Printf("\nsynced writes of the p99 cancellation (after CancelRun sent):\n")
	printWrites(turnWrites(recs, slow))
	fmt.Printf("    %8s             CancelRun answered (interrupt acknowledged)\n", round(slow.end.Sub(slow.t0)))
	printMedianSteps(recs, cancels, raw, "cancellations", "CancelRun sent")
	return nil
}

func round(d time.Duration) string { return fmt.Sprintf("%.2fms", ms(d)) }

func medianInt(xs []int) int {
	s := append([]int(nil), xs...)
	sort.Ints(s)
	return s[len(s)/2]
}

// printMedianSteps prints, for each write or step that most turns have
// (by process, site and occurrence in the turn), the median of its start
// and of its end after SubmitRun over every measured turn: one turn's
// timeline is noisy on a shared box, the medians show where time goes.
//
// Each synced write is shown next to the raw anchor that bounds it (the
// same kind of write, measured in this run) and the ratio.
func printMedianSteps(recs []synctrace.Record, turns []turnWindow, raw anchors, what, after string) {
	type key struct {
		label string
		nth   int
	}
	starts, ends := map[key][]time.Duration{}, map[key][]time.Duration{}
	marks := map[key]string{}
	type siteOf struct {
		process, site string
		step          bool
	}
	sites := map[key]siteOf{}
	for _, w := range turns {
		seen := map[string]int{}
		for _, x := range turnWrites(recs, w) {
			l := strings.SplitN(x.label, " [", 2)[0]
			seen[l]++
			k := key{l, seen[l]}
			starts[k] = append(starts[k], x.start)
			ends[k] = append(ends[k], x.end)
			sites[k] = siteOf{process: strings.SplitN(x.label, " ", 2)[0], site: x.site, step: x.step}
			switch {
			case x.provider:
				marks[k] = "*"
			case x.step:
				marks[k] = "·"
			default:
				marks[k] = " "
			}
		}
	}
	var keys []key
	for k, v := range starts {
		if 2*len(v) >= len(turns) {
			keys = append(keys, k)
		}
	}
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	sort.Slice(keys, func(i, j int) bool { return med(starts[keys[i]]) < med(starts[keys[j]]) })
	fmt.Printf("\nmedians over the %d measured %s (start → end after %s, duration; #n = the n-th in its turn):\n", len(turns), what, after)
	for _, k := range keys {
		durs := make([]time.Duration, len(starts[k]))
		for i := range durs {
			durs[i] = ends[k][i] - starts[k][i]
		}
		label := k.label
		if k.nth > 1 {
			label += fmt.Sprintf(" #%d", k.nth)
		}
		anchor := ""
		if name, d := raw.anchorOf(sites[k].process, sites[k].site, sites[k].step); d > 0 {
			anchor = fmt.Sprintf("   (%s %s: %.1f×)", name, round(d), float64(med(durs))/float64(d))
		}
		fmt.Printf("  %s %8s → %8s  %7s  %s%s\n", marks[k], round(med(starts[k])), round(med(ends[k])), round(med(durs)), label, anchor)
	}
}
