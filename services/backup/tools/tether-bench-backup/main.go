// Command tether-bench-backup measures the backup verifier's deep-verify
// digest throughput against the raw baselines of PERFORMANCE.md, measured in
// the same run on the same bytes:
//
//   - large files (default 1 GiB in 10 files): digest.BackupTree over the
//     files, page-cached, versus crypto/sha256 over the same bytes in memory
//     on one core (target ≥ 70 %);
//   - many small files (default 100 MiB in 10,000 files, and 10,000 × 4 KiB):
//     digest.BackupTree versus a plain open / read loop into a reused buffer /
//     close + sha256 of each file on one core (target ≥ 80 %).
//
// It also reports, for information, the service's deep-verify path: the
// same tree as a canonical tar in memory, digested with archive.DigestTar.
// Data is generated at run time in a temporary directory (-dir) and removed
// at the end. Each measurement is the best of -runs, tether and raw
// interleaved.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/tether-run/tether/pkg/archive"
	"github.com/tether-run/tether/pkg/digest"
)

type result struct {
	name, baseline string
	unit           string
	tether, raw    float64 // unit per second
	target         float64
	info           bool
}

func (r result) ratio() float64 { return r.tether / r.raw }

func main() {
	largeFiles := flag.Int("large-files", 10, "number of large files")
	largeTotal := flag.String("large-total", "1GiB", "total size of the large files (100MiB: the 10 × 10 MiB case)")
	smallFiles := flag.Int("small-files", 10000, "number of small files")
	smallTotal := flag.String("small-total", "100MiB", "total size of the small files")
	tinySize := flag.String("tiny-size", "4KiB", "size of each file of the PERFORMANCE.md case of -small-files files (0: skip)")
	runs := flag.Int("runs", 5, "repetitions per measurement (best counts)")
	dir := flag.String("dir", "", "where to generate data (default: a new temporary directory, removed afterwards)")
	workers := flag.Int("workers", 0, "digest workers (0: default)")
	flag.Parse()
	lt, err1 := parseSize(*largeTotal)
	st, err2 := parseSize(*smallTotal)
	ts, err3 := parseSize(*tinySize)
	if err1 != nil || err2 != nil || err3 != nil || *runs < 1 {
		fmt.Fprintln(os.Stderr, "tether-bench-backup: bad size or runs")
		os.Exit(2)
	}
	base, err := os.MkdirTemp(*dir, "tether-bench-backup-")
	if err != nil {
		fail(err)
	}
	cleanup := func() { os.RemoveAll(base) }
	defer cleanup()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() { <-sig; cleanup(); os.Exit(130) }()

	opts := digest.Options{Workers: *workers}
	fmt.Printf("bench-backup: GOMAXPROCS=%d, data in %s\n", runtime.GOMAXPROCS(0), base)
	var results []result

	large := filepath.Join(base, "large")
	gen(large, *largeFiles, lt, 1)
	results = append(results, measureLarge(fmt.Sprintf("deep verify, %s in %d files", human(lt), *largeFiles), large, *runs, opts)...)
	os.RemoveAll(large)

	small := filepath.Join(base, "small")
	gen(small, *smallFiles, st, 2)
	results = append(results, measureSmall(fmt.Sprintf("deep verify, %s in %d files", human(st), *smallFiles), small, *smallFiles, *runs, opts)...)
	os.RemoveAll(small)

	if ts > 0 {
		tiny := filepath.Join(base, "tiny")
		gen(tiny, *smallFiles, ts*int64(*smallFiles), 3)
		results = append(results, measureSmall(fmt.Sprintf("deep verify, %d × %s", *smallFiles, human(ts)), tiny, *smallFiles, *runs, opts)...)
	}
	report(os.Stdout, results)
}

// gen writes n files totalling total bytes below dir (equal sizes, the last
// one takes the remainder), 100 per subdirectory.
func gen(dir string, n int, total int64, seed uint64) {
	r := rand.New(rand.NewChaCha8([32]byte{byte(seed)}))
	each := total / int64(n)
	buf := make([]byte, min(total-each*int64(n-1), 8<<20))
	for i := range n {
		size := each
		if i == n-1 {
			size = total - each*int64(n-1)
		}
		sub := filepath.Join(dir, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(sub, 0o755); err != nil {
				fail(err)
			}
		}
		f, err := os.Create(filepath.Join(sub, fmt.Sprintf("f%05d", i)))
		if err != nil {
			fail(err)
		}
		for left := size; left > 0; {
			b := buf[:min(int64(len(buf)), left)]
			for j := 0; j+8 <= len(b); j += 8 {
				v := r.Uint64()
				for k := range 8 {
					b[j+k] = byte(v >> (8 * k))
				}
			}
			if _, err := f.Write(b); err != nil {
				fail(err)
			}
			left -= int64(len(b))
		}
		if err := f.Close(); err != nil {
			fail(err)
		}
	}
}

// files lists the regular files below dir in walk order.
func files(dir string) []string {
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		fail(err)
	}
	return out
}

func best(runs int, f func() int64) (time.Duration, int64) {
	var bestD time.Duration
	var n int64
	for i := range runs {
		t0 := time.Now()
		n = f()
		d := time.Since(t0)
		if i == 0 || d < bestD {
			bestD = d
		}
	}
	return bestD, n
}

func tetherDigest(dir string, opts digest.Options) int64 {
	r, err := digest.BackupTree(dir, opts)
	if err != nil {
		fail(err)
	}
	return r.Bytes
}

// plainHash is the PERFORMANCE.md baseline: one goroutine, open / read loop
// into one reused buffer / close, a sha256 per file.
func plainHash(paths []string, buf []byte) int64 {
	var total int64
	h := sha256.New()
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			fail(err)
		}
		h.Reset()
		for {
			n, err := f.Read(buf)
			h.Write(buf[:n])
			total += int64(n)
			if err == io.EOF {
				break
			}
			if err != nil {
				fail(err)
			}
		}
		f.Close()
		h.Sum(nil)
	}
	return total
}

func tarOf(dir string) []byte {
	var b bytes.Buffer
	tw := archiveWriter(&b)
	if _, err := archive.WriteTar(tw, dir, archive.WriteOptions{Prefix: "tree"}); err != nil {
		fail(err)
	}
	if err := tw.Close(); err != nil {
		fail(err)
	}
	return b.Bytes()
}

func digestTar(data []byte, entries int) int64 {
	lim := archive.Limits{MaxArchiveBytes: int64(len(data)), MaxExpandedBytes: int64(len(data)), MaxEntries: entries}
	d, _, err := archive.DigestTar(bytes.NewReader(data), lim)
	if err != nil {
		fail(err)
	}
	return d["tree"].Bytes
}

func measureLarge(name, dir string, runs int, opts digest.Options) []result {
	paths := files(dir)
	var mem [][]byte
	var total int64
	for _, p := range paths {
		b, err := os.ReadFile(p) // also warms the page cache
		if err != nil {
			fail(err)
		}
		mem = append(mem, b)
		total += int64(len(b))
	}
	var tetherBest, rawBest time.Duration
	for i := range runs {
		td, n := best(1, func() int64 { return tetherDigest(dir, opts) })
		if n != total {
			fail(fmt.Errorf("digest saw %d bytes, want %d", n, total))
		}
		rd, _ := best(1, func() int64 {
			h := sha256.New()
			for _, b := range mem {
				h.Reset()
				h.Write(b)
				h.Sum(nil)
			}
			return total
		})
		if i == 0 || td < tetherBest {
			tetherBest = td
		}
		if i == 0 || rd < rawBest {
			rawBest = rd
		}
	}
	mb := float64(total) / 1e6
	out := []result{{name: name, baseline: "crypto/sha256 in memory, 1 core", unit: "MB/s",
		tether: mb / tetherBest.Seconds(), raw: mb / rawBest.Seconds(), target: 0.70}}
	prev := runtime.GOMAXPROCS(1)
	one, _ := best(runs, func() int64 { return tetherDigest(dir, opts) })
	runtime.GOMAXPROCS(prev)
	out = append(out, result{name: name + ", tether on 1 core", baseline: "crypto/sha256 in memory, 1 core",
		unit: "MB/s", tether: mb / one.Seconds(), raw: mb / rawBest.Seconds(), target: 0.70, info: true})
	mem = nil
	runtime.GC()
	data := tarOf(dir)
	dd, _ := best(runs, func() int64 { return digestTar(data, len(paths)+100) })
	out = append(out, result{name: name + ", service path (tar stream)", baseline: "crypto/sha256 in memory, 1 core",
		unit: "MB/s", tether: mb / dd.Seconds(), raw: mb / rawBest.Seconds(), target: 0.70, info: true})
	return out
}

func measureSmall(name, dir string, n, runs int, opts digest.Options) []result {
	paths := files(dir)
	buf := make([]byte, 256<<10)
	total := plainHash(paths, buf) // warms the page cache
	var tetherBest, rawBest time.Duration
	for i := range runs {
		td, got := best(1, func() int64 { return tetherDigest(dir, opts) })
		if got != total {
			fail(fmt.Errorf("digest saw %d bytes, want %d", got, total))
		}
		rd, _ := best(1, func() int64 { return plainHash(paths, buf) })
		if i == 0 || td < tetherBest {
			tetherBest = td
		}
		if i == 0 || rd < rawBest {
			rawBest = rd
		}
	}
	files := float64(n)
	out := []result{{name: name, baseline: "open/read loop/close + sha256, 1 core", unit: "files/s",
		tether: files / tetherBest.Seconds(), raw: files / rawBest.Seconds(), target: 0.80}}
	prev := runtime.GOMAXPROCS(1)
	one, _ := best(runs, func() int64 { return tetherDigest(dir, opts) })
	runtime.GOMAXPROCS(prev)
	out = append(out, result{name: name + ", tether on 1 core", baseline: "open/read loop/close + sha256, 1 core",
		unit: "files/s", tether: files / one.Seconds(), raw: files / rawBest.Seconds(), target: 0.80, info: true})
	data := tarOf(dir)
	dd, _ := best(runs, func() int64 { return digestTar(data, n+1000) })
	out = append(out, result{name: name + ", service path (tar stream)", baseline: "open/read loop/close + sha256, 1 core",
		unit: "files/s", tether: files / dd.Seconds(), raw: files / rawBest.Seconds(), target: 0.80, info: true})
	return out
}

func report(w io.Writer, results []result) {
	rows := [][]string{{"figure", "unit", "tether", "raw", "ratio", "target", "met", "raw baseline"}}
	for _, r := range results {
		met := mark(r)
		target := fmt.Sprintf("≥ %.0f %%", 100*r.target)
		if r.info {
			met, target = "(info)", "—"
		}
		rows = append(rows, []string{r.name, r.unit, thousands(r.tether), thousands(r.raw),
			fmt.Sprintf("%.1f %%", 100*r.ratio()), target, met, r.baseline})
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < 2 || i == len(row)-1 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w)
	for _, r := range results {
		if r.info {
			continue
		}
		fmt.Fprintf(w, "BENCH %s tether=%.1f raw=%.1f ratio=%.3f target=%.2f met=%t unit=%s\n",
			strings.NewReplacer(" ", "_", ",", "", "(", "", ")", "", "×", "x").Replace(r.name),
			r.tether, r.raw, r.ratio(), r.target, r.ratio() >= r.target, r.unit)
	}
}

func mark(r result) string {
	if r.ratio() >= r.target {
		return "✓"
	}
	return "✗"
}

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

func parseSize(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n * mult, err
}

func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "tether-bench-backup:", err)
	os.Exit(1)
}

func archiveWriter(w io.Writer) *tar.Writer { return tar.NewWriter(w) }
