// Command gencorpus writes the malicious-archive corpus of pkg/archive's
// tests (testdata/malicious) and the seed corpus of FuzzExtract
// (testdata/fuzz/FuzzExtract). Run it from the repository root:
//
//	go run ./pkg/archive/internal/gencorpus
//
// Every archive is built by hand with archive/tar so that it holds exactly
// the hostile entry it is named after; the outputs are committed.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

var epoch = time.Unix(1767225600, 0) // fixed, so the outputs are reproducible

type entry struct {
	hdr  tar.Header
	data []byte
}

func dir(name string, mode int64) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: epoch}}
}

func file(name string, mode int64, data string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: epoch}, data: []byte(data)}
}

func build(entries ...entry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := e.hdr
		h.Format = tar.FormatGNU
		if err := tw.WriteHeader(&h); err != nil {
			panic(fmt.Sprintf("%s: %v", h.Name, err))
		}
		if _, err := tw.Write(e.data); err != nil {
			panic(err)
		}
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// sizeBomb is a header that declares an 8 GiB file followed by one block of
// data and nothing else: tar.Writer refuses to write it, so it is patched.
func sizeBomb() []byte {
	b := build(dir("./", 0o755), file("./big", 0o644, "x"))
	// The second header starts at 512; its size field is at offset 124 (12
	// bytes, octal, NUL-terminated).
	copy(b[512+124:512+136], fmt.Sprintf("%011o\x00", int64(0o77777777777)))
	sum := 0
	for i := 512; i < 1024; i++ {
		if i >= 512+148 && i < 512+156 {
			sum += ' '
		} else {
			sum += int(b[i])
		}
	}
	copy(b[512+148:512+156], fmt.Sprintf("%06o\x00 ", sum))
	return b[:2048] // header, one data block, then the stream ends
}

func expansionBomb() []byte {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	zeros := make([]byte, 1<<20)
	for i := range 2 {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: "./zeros-" + strconv.Itoa(i), Mode: 0o644, Size: 40 << 20, ModTime: epoch, Format: tar.FormatGNU}
		if err := tw.WriteHeader(h); err != nil {
			panic(err)
		}
		for range 40 {
			if _, err := tw.Write(zeros); err != nil {
				panic(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		panic(err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	zw.ModTime = epoch
	if _, err := zw.Write(raw.Bytes()); err != nil {
		panic(err)
	}
	if err := zw.Close(); err != nil {
		panic(err)
	}
	return gz.Bytes()
}

// Malicious maps file names to archives; each must be refused.
func malicious() map[string][]byte {
	return map[string][]byte{
		"symlink.tar": build(dir("./", 0o755),
			entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "./host-secret", Linkname: "/etc/passwd", Mode: 0o777, ModTime: epoch}}),
		"hardlink.tar": build(dir("./", 0o755), file("./a.txt", 0o644, "a"),
			entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "./b.txt", Linkname: "./a.txt", Mode: 0o644, ModTime: epoch}}),
		"absolute.tar":      build(file("/tmp/tether-absolute-escape", 0o644, "escape")),
		"dotdot.tar":        build(dir("./", 0o755), file("./ok.txt", 0o644, "ok"), file("../dotdot-escape", 0o644, "escape")),
		"dotdot_nested.tar": build(dir("./a/", 0o755), file("./a/../../dotdot-escape", 0o644, "escape")),
		"device.tar": build(dir("./", 0o755),
			entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "./null", Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: epoch}}),
		"blockdev.tar": build(dir("./", 0o755),
			entry{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "./sda", Mode: 0o660, Devmajor: 8, Devminor: 0, ModTime: epoch}}),
		"fifo.tar": build(dir("./", 0o755),
			entry{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "./pipe", Mode: 0o600, ModTime: epoch}}),
		"setuid.tar":         build(dir("./", 0o755), file("./bin", 0o4755, "#!/bin/sh\n")),
		"setgid_dir.tar":     build(dir("./", 0o755), dir("./shared/", 0o2775)),
		"duplicate.tar":      build(dir("./", 0o755), file("./a.txt", 0o644, "first"), file("./a.txt", 0o644, "second")),
		"size_bomb.tar":      sizeBomb(),
		"expansion_bomb.tgz": expansionBomb(),
	}
}

func valid() []byte {
	return build(dir("./", 0o700), dir("./sessions/", 0o700), file("./sessions/thread.jsonl", 0o600, "thread-state\n"),
		file("./state.json", 0o644, `{"ok":true}`))
}

// modes are accepted archives whose directories have modes a staging tree
// must survive (SPEC S4): extraction clamps them with archive.SafeDirMode.
func modes() map[string][]byte {
	out := map[string][]byte{}
	for _, m := range []int64{0o000, 0o500, 0o555, 0o777, 0o1777} {
		out[fmt.Sprintf("seed_dir_mode_%04o.tar", m)] = build(dir("./", 0o755), dir("./locked/", m),
			dir("./locked/inner/", m), file("./locked/inner/state.json", 0o600, `{"ok":true}`))
	}
	return out
}

func main() {
	out := flag.String("out", "pkg/archive/testdata", "testdata directory")
	flag.Parse()
	mal := malicious()
	names := make([]string, 0, len(mal))
	for n := range mal {
		names = append(names, n)
	}
	sort.Strings(names)
	must(os.MkdirAll(filepath.Join(*out, "malicious"), 0o755))
	fuzzDir := filepath.Join(*out, "fuzz", "FuzzExtract")
	must(os.MkdirAll(fuzzDir, 0o755))
	for _, n := range names {
		must(os.WriteFile(filepath.Join(*out, "malicious", n), mal[n], 0o644))
		if n != "expansion_bomb.tgz" {
			must(os.WriteFile(filepath.Join(fuzzDir, "seed_"+n), seed(mal[n]), 0o644))
		}
	}
	must(os.WriteFile(filepath.Join(fuzzDir, "seed_valid.tar"), seed(valid()), 0o644))
	for n, data := range modes() {
		must(os.WriteFile(filepath.Join(fuzzDir, n), seed(data), 0o644))
	}
	fmt.Printf("gencorpus: wrote %d archives and %d fuzz seeds under %s\n", len(names), len(names)+len(modes()), *out)
}

// seed renders data in the go test fuzz corpus format.
func seed(data []byte) []byte {
	return []byte("go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n")
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "gencorpus:", err)
		os.Exit(1)
	}
}
