package chunkio

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReaderJoinsChunksAndReportsTheEndingError(t *testing.T) {
	t.Parallel()
	chunks := [][]byte{[]byte("ab"), nil, []byte("cde")}
	r := NewReader(func() ([]byte, error) {
		if len(chunks) == 0 {
			return nil, io.EOF
		}
		c := chunks[0]
		chunks = chunks[1:]
		return c, nil
	})
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, "abcde", string(b))
	require.NoError(t, r.Err())

	boom := errors.New("boom")
	r = NewReader(func() ([]byte, error) { return nil, boom })
	_, err = io.ReadAll(r)
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, r.Err(), boom)
}

func TestWriterSendsBoundedCopiedChunks(t *testing.T) {
	t.Parallel()
	var sent [][]byte
	w := NewWriter(4, func(c []byte) error { sent = append(sent, c); return nil })
	_, err := w.Write([]byte("abcdef"))
	require.NoError(t, err)
	_, err = w.Write([]byte("ghij"))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	require.Equal(t, [][]byte{[]byte("abcd"), []byte("efgh"), []byte("ij")}, sent)
	require.Equal(t, "abcdefghij", string(bytes.Join(sent, nil)))

	boom := errors.New("boom")
	w = NewWriter(2, func([]byte) error { return boom })
	_, err = w.Write([]byte("abc"))
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, w.Close(), boom)
	require.ErrorIs(t, w.Err(), boom)
}
