// Package chunkio adapts gRPC streams of byte chunks to io.Reader and
// io.Writer, so archive code reads and writes plain streams: one adapter for
// every upload and download of a checkpoint, with no goroutine or pipe in
// between.
package chunkio

import (
	"errors"
	"io"
)

// Reader reads the bytes of a stream of chunks. next returns the following
// chunk, io.EOF at the end of the stream, or an error that ends the read.
type Reader struct {
	next func() ([]byte, error)
	buf  []byte
	err  error
}

// NewReader returns a Reader over next.
func NewReader(next func() ([]byte, error)) *Reader { return &Reader{next: next} }

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.buf, r.err = r.next()
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Err returns the error that ended the stream, nil at its clean end (or
// while it goes on).
func (r *Reader) Err() error {
	if errors.Is(r.err, io.EOF) {
		return nil
	}
	return r.err
}

// Writer cuts what is written into chunks of at most size bytes and sends
// each (a copy) with send. Close sends what is left.
type Writer struct {
	send func([]byte) error
	buf  []byte
	err  error
}

// NewWriter returns a Writer sending chunks of at most size bytes.
func NewWriter(size int, send func([]byte) error) *Writer {
	return &Writer{send: send, buf: make([]byte, 0, size)}
}

// Write implements io.Writer.
func (w *Writer) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if w.err != nil {
			return n, w.err
		}
		k := min(len(p), cap(w.buf)-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p, n = p[k:], n+k
		if len(w.buf) == cap(w.buf) {
			w.flush()
		}
	}
	return n, w.err
}

// Close sends the last, partial chunk.
func (w *Writer) Close() error {
	if w.err == nil && len(w.buf) > 0 {
		w.flush()
	}
	return w.err
}

// Err returns the send error that stopped the writer, if any.
func (w *Writer) Err() error { return w.err }

func (w *Writer) flush() {
	w.err = w.send(append([]byte(nil), w.buf...))
	w.buf = w.buf[:0]
}
