package prp

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tether-run/tether/pkg/digest"
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
// can be forwarded on a protobuf stream as is; its encoding can be handed
// back with ReleaseRelayBatch once forwarded. Every other frame is decoded
// as by Unmarshal.
func UnmarshalRelay(b []byte) (*prpv1.Frame, error) {
	if len(b) > MaxFrameBytes {
		return nil, errorf(failure.ProviderFrameTooLarge, "frame of %d bytes exceeds %d bytes", len(b), MaxFrameBytes)
	}
	dst := relayBuf()
	if raw, ok := transcodeEventBatchInto(dst, b); ok {
		return &prpv1.Frame{Kind: &prpv1.Frame_Events{Events: relayBatch(raw)}}, nil
	}
	putRelayBuf(dst)
	return Unmarshal(b)
}

// CanonicalJSON encodes v as canonical JSON (RFC 8785 as digest.Canonical
// writes it: keys sorted, no insignificant whitespace, JavaScript number and
// string forms). Proto messages are first encoded with protojson;
// json.RawMessage and []byte inputs are taken as JSON text.
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
		return digest.Canonical(v)
	}
	tree, err := digest.ParseJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("canonical json: %w", err)
	}
	return digest.Canonical(tree)
}
