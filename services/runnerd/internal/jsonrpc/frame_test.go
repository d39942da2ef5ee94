package jsonrpc

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestR2_FrameLimitBoundary(t *testing.T) {
	t.Parallel()
	exact := strings.Repeat("a", MaxFrameBytes)
	br := bufio.NewReaderSize(strings.NewReader(exact+"\r\n"+exact+"a\n"), 64<<10)
	var buf []byte
	line, err := ReadFrame(br, &buf)
	require.NoError(t, err)
	assert.Len(t, line, MaxFrameBytes)
	_, err = ReadFrame(br, &buf)
	assert.ErrorIs(t, err, ErrFrameTooLarge)

	br = bufio.NewReaderSize(strings.NewReader("{}\nlast"), 16)
	line, err = ReadFrame(br, &buf)
	require.NoError(t, err)
	assert.Equal(t, "{}", string(line))
	line, err = ReadFrame(br, &buf)
	assert.Equal(t, "last", string(line))
	assert.ErrorIs(t, err, io.EOF) // with the final unterminated line
}

func TestParseRoutesByPresence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		line   string
		kind   Kind
		answer bool
	}{
		{`{"jsonrpc":"2.0","id":0,"result":{}}`, Response, true},
		{`{"id":7,"result":null}`, Response, true},
		{`{"id":"x","error":{"code":-1,"message":"no"}}`, Response, true},
		{`{"id":3}`, Unroutable, true},
		{`{"id":null,"result":{}}`, Unroutable, false},
		{`{"id":4,"method":"item/tool/call","params":{}}`, Request, false},
		{`{"method":"turn/started","params":{}}`, Notification, false},
		{`{"method":"x","id":null}`, Notification, false},
		{` {} `, Unroutable, false},
	} {
		m, err := Parse([]byte(tc.line))
		require.NoError(t, err, tc.line)
		assert.Equal(t, tc.kind, m.Kind(), tc.line)
		assert.Equal(t, tc.answer, m.Answer(), tc.line)
	}
	for _, bad := range []string{"", "  ", "[]", "null", `"x"`, "{", `{"id":}`, `{"method":1}`} {
		_, err := Parse([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestWireErrorIsLenient(t *testing.T) {
	t.Parallel()
	m, err := Parse([]byte(`{"id":1,"error":{"code":-32601,"message":"nope","data":{"a":1}}}`))
	require.NoError(t, err)
	assert.Equal(t, &Error{Code: -32601, Message: "nope", Data: []byte(`{"a":1}`)}, m.WireError())
	m, err = Parse([]byte(`{"id":1,"error":"broken"}`))
	require.NoError(t, err)
	assert.Equal(t, &Error{Message: "unparseable error object"}, m.WireError())
	m, err = Parse([]byte(`{"id":1,"error":null,"result":{}}`))
	require.NoError(t, err)
	assert.Nil(t, m.WireError())
	id, ok := m.IntID()
	assert.True(t, ok)
	assert.Equal(t, int64(1), id)

	long := &Error{Code: 5, Message: strings.Repeat("é", 600)}
	d := long.Describe()
	assert.True(t, strings.HasSuffix(d, "… (code 5)"))
	assert.LessOrEqual(t, len(d), 1024+len("… (code 5)"))
}

// FuzzFrame feeds untrusted provider stdout through the frame reader and
// the parser: neither may panic, no frame exceeds the bound, and whatever
// parses routes to exactly one kind consistently with its members.
func FuzzFrame(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{"thread":{"id":"t"}}}` + "\n",
		`{"jsonrpc":"2.0","method":"item/agentMessage/delta","params":{"delta":"hi"}}` + "\r\n",
		`{"jsonrpc":"2.0","id":"r1","method":"session/request_permission","params":{}}` + "\n" + `{"id":2,"error":{"code":-1}}`,
		"\n\n  \n{}\n",
		`{"id":null,"method":""}`,
		"\x00\xff{\"id\":1e999}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		var buf []byte
		for i := 0; i <= len(data); i++ {
			line, err := ReadFrame(br, &buf)
			if len(line) > MaxFrameBytes {
				t.Fatalf("frame of %d bytes", len(line))
			}
			if bytes.HasSuffix(line, []byte("\n")) {
				t.Fatalf("frame keeps its terminator: %q", line)
			}
			if m, perr := Parse(line); perr == nil {
				k := m.Kind()
				if (k == Request || k == Notification) && m.Method == "" {
					t.Fatalf("%q routed as %d without a method", line, k)
				}
				if k == Response && !m.Answer() {
					t.Fatalf("%q is a response but no answer", line)
				}
				_ = m.WireError()
				_, _ = m.IntID()
			}
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
		}
		t.Fatalf("reader did not end")
	})
}
