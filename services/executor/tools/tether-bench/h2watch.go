package main

// The watch curve's receivers. Real WatchRun clients run on other machines;
// here 1,000 of them share the executor's two cores. grpc-go's client
// spends about as much CPU per received message as the executor spends
// sending it (a goroutine wake-up per stream and message), so with its
// receivers the curve measured the bench as much as the executor.
// -watch-client h2 (the default) receives with bare HTTP/2 connections
// instead: one goroutine per connection reads every frame and notes each
// response's seq for its stream, so the executor has the cores to itself
// as it would with remote clients. -watch-client grpc keeps grpc-go's
// receivers (the end-to-end figure on one machine).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
)

// h2Window is the flow-control window the bare receiver grants (stream and
// connection); it tops it up once half of it was consumed.
const h2Window = 1 << 30

// h2Conn is one bare HTTP/2 connection carrying WatchRun streams.
type h2Conn struct {
	conn net.Conn
	fr   *http2.Framer
	addr string

	wmu  sync.Mutex // writes: the framer, the header encoder
	hbuf bytes.Buffer
	henc *hpack.Encoder
	next uint32 // the next stream id (odd)

	mu      sync.Mutex
	streams map[uint32]*h2Stream
	err     error // why the connection ended

	connUnacked uint32 // connection window consumed, not yet granted again (read loop only)
}

// h2Stream is one WatchRun stream: its undecoded bytes and what it does with
// each response's seq.
type h2Stream struct {
	buf     []byte
	unacked uint32
	onSeq   func(uint64)
}

// dialH2 opens a connection to addr and starts its read loop.
func dialH2(addr string) (*h2Conn, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	// Buffered reads: a frame is a few hundred bytes, not two syscalls.
	c := &h2Conn{conn: nc, fr: http2.NewFramer(nc, bufio.NewReaderSize(nc, 64<<10)), addr: addr, next: 1, streams: map[uint32]*h2Stream{}}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2Window}); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteWindowUpdate(0, h2Window-65535); err != nil {
		nc.Close()
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

// watch opens a WatchRun stream of runID after seq after; onSeq is called,
// from the connection's read loop, with each response's seq.
func (c *h2Conn) watch(runID string, after uint64, onSeq func(uint64)) error {
	req, err := proto.Marshal(&executorv1.WatchRunRequest{RunId: runID, AfterSeq: after})
	if err != nil {
		return err
	}
	msg := make([]byte, 5+len(req))
	binary.BigEndian.PutUint32(msg[1:5], uint32(len(req)))
	copy(msg[5:], req)

	c.wmu.Lock()
	defer c.wmu.Unlock()
	id := c.next
	c.next += 2
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.streams[id] = &h2Stream{onSeq: onSeq}
	c.mu.Unlock()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"},
		{":path", executorv1.ExecutorService_WatchRun_FullMethodName}, {":authority", c.addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	return c.fr.WriteData(id, true, msg)
}

// readLoop reads every frame of the connection until it fails.
func (c *h2Conn) readLoop() {
	err := c.read()
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	c.conn.Close()
}

func (c *h2Conn) read() error {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := c.write(func() error { return c.fr.WriteSettingsAck() }); err != nil {
					return err
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := c.write(func() error { return c.fr.WritePing(true, f.Data) }); err != nil {
					return err
				}
			}
		case *http2.GoAwayFrame:
			return fmt.Errorf("the executor sent GOAWAY (%v)", f.ErrCode)
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				// Trailers (or a trailers-only response): the stream ended.
				if st := f.PseudoValue("status"); st != "" && st != "200" {
					return fmt.Errorf("stream %d: HTTP status %s", f.StreamID, st)
				}
				if code := headerValue(f, "grpc-status"); code != "0" {
					return fmt.Errorf("stream %d ended: grpc-status %s %s", f.StreamID, code, headerValue(f, "grpc-message"))
				}
				c.mu.Lock()
				delete(c.streams, f.StreamID)
				c.mu.Unlock()
			}
		case *http2.RSTStreamFrame:
			return fmt.Errorf("stream %d reset: %v", f.StreamID, f.ErrCode)
		case *http2.DataFrame:
			if err := c.data(f); err != nil {
				return err
			}
		}
	}
}

// data takes the stream's gRPC messages out of a DATA frame and grants the
// flow-control window back once half of it was consumed.
func (c *h2Conn) data(f *http2.DataFrame) error {
	c.mu.Lock()
	s := c.streams[f.StreamID]
	c.mu.Unlock()
	if s == nil {
		return fmt.Errorf("DATA on unknown stream %d", f.StreamID)
	}
	n := uint32(f.Length)
	s.buf = append(s.buf, f.Data()...)
	for len(s.buf) >= 5 {
		size := int(binary.BigEndian.Uint32(s.buf[1:5]))
		if len(s.buf) < 5+size {
			break
		}
		if s.buf[0] != 0 {
			return errors.New("a compressed response")
		}
		seq, err := seqOf(s.buf[5 : 5+size])
		if err != nil {
			return err
		}
		s.onSeq(seq)
		s.buf = s.buf[5+size:]
	}
	if len(s.buf) == 0 {
		s.buf = s.buf[:0:0] // let the decoded bytes go
	}
	s.unacked += n
	c.connUnacked += n
	if s.unacked < h2Window/2 && c.connUnacked < h2Window/2 {
		return nil
	}
	return c.write(func() error {
		if s.unacked >= h2Window/2 {
			if err := c.fr.WriteWindowUpdate(f.StreamID, s.unacked); err != nil {
				return err
			}
			s.unacked = 0
		}
		if c.connUnacked >= h2Window/2 {
			if err := c.fr.WriteWindowUpdate(0, c.connUnacked); err != nil {
				return err
			}
			c.connUnacked = 0
		}
		return nil
	})
}

func (c *h2Conn) write(fn func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return fn()
}

func (c *h2Conn) Close() error { return c.conn.Close() }

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, h := range f.RegularFields() {
		if strings.EqualFold(h.Name, name) {
			return h.Value
		}
	}
	return ""
}

// seqOf is the seq (field 1) of an encoded WatchRunResponse, 0 when it has
// none.
func seqOf(data []byte) (uint64, error) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		data = data[n:]
		if num == 1 && typ == protowire.VarintType {
			seq, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			return seq, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, data)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		data = data[n:]
	}
	return 0, nil
}
