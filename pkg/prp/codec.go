package prp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

var (
	marshalOpts   = protojson.MarshalOptions{}
	unmarshalOpts = protojson.UnmarshalOptions{DiscardUnknown: true}
)

// Marshal encodes a frame as protojson (camelCase field names, compact).
// Frames larger than MaxFrameBytes fail with provider_frame_too_large.
func Marshal(f *prpv1.Frame) ([]byte, error) {
	if f == nil || f.Kind == nil {
		return nil, errorf(failure.RunnerProtocolError, "frame has no kind")
	}
	b, err := marshalOpts.Marshal(f)
	if err != nil {
		return nil, errorf(failure.RunnerProtocolError, "encode frame: %v", err)
	}
	// protojson output is deliberately unstable in whitespace; compact it so
	// the bytes on the wire do not depend on the build.
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return nil, errorf(failure.RunnerProtocolError, "compact frame: %v", err)
	}
	if buf.Len() > MaxFrameBytes {
		return nil, errorf(failure.ProviderFrameTooLarge, "frame of %d bytes exceeds %d bytes", buf.Len(), MaxFrameBytes)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes a protojson frame. Unknown fields are discarded (forward
// compatibility); a frame without a known kind is a protocol error.
func Unmarshal(b []byte) (*prpv1.Frame, error) {
	if len(b) > MaxFrameBytes {
		return nil, errorf(failure.ProviderFrameTooLarge, "frame of %d bytes exceeds %d bytes", len(b), MaxFrameBytes)
	}
	if f, ok := decodeEventBatch(b); ok {
		return f, nil
	}
	f := &prpv1.Frame{}
	if err := unmarshalOpts.Unmarshal(b, f); err != nil {
		return nil, errorf(failure.RunnerProtocolError, "decode frame: %v", err)
	}
	if f.Kind == nil {
		return nil, errorf(failure.RunnerProtocolError, "frame carries no known kind")
	}
	return f, nil
}

// UnmarshalRelay is Unmarshal for a relay (the gateway): an event batch in
// runnerd's shape is transcoded straight to its protobuf encoding and
// carried opaquely — GetEvents of the returned batch is empty, but the
// batch marshals to exactly the encoding of the events it carries, so it
// can be forwarded on a protobuf stream as is. Every other frame is
// decoded as by Unmarshal.
func UnmarshalRelay(b []byte) (*prpv1.Frame, error) {
	if len(b) > MaxFrameBytes {
		return nil, errorf(failure.ProviderFrameTooLarge, "frame of %d bytes exceeds %d bytes", len(b), MaxFrameBytes)
	}
	if raw, ok := transcodeEventBatch(b); ok {
		return &prpv1.Frame{Kind: &prpv1.Frame_Events{Events: relayBatch(raw)}}, nil
	}
	return Unmarshal(b)
}

// CanonicalJSON encodes v as JSON with object keys sorted recursively, no
// insignificant whitespace and no HTML escaping. Proto messages are first
// encoded with protojson; json.RawMessage and []byte inputs are taken as JSON
// text. Numbers keep their textual form.
func CanonicalJSON(v any) ([]byte, error) {
	var raw []byte
	switch t := v.(type) {
	case proto.Message:
		b, err := protojson.Marshal(t)
		if err != nil {
			return nil, err
		}
		raw = b
	case json.RawMessage:
		raw = t
	case []byte:
		raw = t
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		raw = b
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("canonical json: trailing data")
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, tree); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch t := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(t))
		for k := range t {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeString(buf, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := writeCanonical(buf, t[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range t {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case string:
		return writeString(buf, t)
	case json.Number:
		buf.WriteString(t.String())
	case bool:
		if t {
			buf.WriteString("true")
		} else {
			buf.WriteString("false")
		}
	case nil:
		buf.WriteString("null")
	default:
		return fmt.Errorf("canonical json: unexpected %T", v)
	}
	return nil
}

func writeString(buf *bytes.Buffer, s string) error {
	var sb bytes.Buffer
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return err
	}
	buf.Write(bytes.TrimSuffix(sb.Bytes(), []byte{'\n'}))
	return nil
}
