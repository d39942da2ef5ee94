package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// report prints the aligned table, then one BENCH line per figure.
func report(w io.Writer, results []result) {
	rows := [][]string{{"figure", "unit", "tether", "raw", "ratio", "target", "met"}}
	for _, r := range results {
		rows = append(rows, []string{r.name, r.unit, thousands(r.tether.rate()), thousands(r.raw.rate()),
			fmt.Sprintf("%.1f %%", 100*r.ratio()), fmt.Sprintf("≥ %.0f %%", 100*r.target), mark(r.ratio() >= r.target)})
		if r.p99Limit > 0 {
			rows = append(rows, []string{r.name + " p99", "ms", fmt.Sprintf("%.3f", ms(r.tetherP99)), fmt.Sprintf("%.3f", ms(r.rawP99)),
				fmt.Sprintf("%.2f×", r.p99Ratio()), fmt.Sprintf("≤ %.0f×", r.p99Limit), mark(r.p99Ratio() <= r.p99Limit)})
		}
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		var b strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < 2 { // names left, numbers right
				b.WriteString(cell + pad)
			} else {
				b.WriteString(pad + cell)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w)
	for _, r := range results {
		fmt.Fprintf(w, "BENCH %s tether=%.1f raw=%.1f ratio=%.3f target=%.2f met=%t unit=%s\n",
			r.name, r.tether.rate(), r.raw.rate(), r.ratio(), r.target, met(r), r.unit)
		if r.p99Limit > 0 {
			fmt.Fprintf(w, "BENCH %s_p99 tether=%.3f raw=%.3f ratio=%.3f target=%.2f met=%t unit=ms\n",
				r.name, ms(r.tetherP99), ms(r.rawP99), r.p99Ratio(), r.p99Limit, r.p99Ratio() <= r.p99Limit)
		}
	}
}

// met is whether a figure reached its targets (rate, and p99 where set).
func met(r result) bool {
	return r.ratio() >= r.target && (r.p99Limit == 0 || r.p99Ratio() <= r.p99Limit)
}

func mark(ok bool) string {
	if ok {
		return "✓"
	}
	return "✗"
}

// thousands formats a rate as an integer with grouping commas.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
