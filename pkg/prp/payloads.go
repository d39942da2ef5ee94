package prp

import (
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

// Payload returns msg, a typed event payload (tether/prp/v1/payloads.proto),
// as the Struct an Event carries: its protojson form, the object every
// release writes and reads for that event type.
func Payload(msg proto.Message) (*structpb.Struct, error) {
	return structOf(protojson.MarshalOptions{}, msg)
}

// PayloadAll is Payload with every field written, zero values too (the
// control plane's events, which the previous release wrote so).
func PayloadAll(msg proto.Message) (*structpb.Struct, error) {
	return structOf(protojson.MarshalOptions{EmitUnpopulated: true}, msg)
}

// structOf is msg's protojson form, written with opts, as a Struct.
func structOf(opts protojson.MarshalOptions, msg proto.Message) (*structpb.Struct, error) {
	raw, err := opts.Marshal(msg)
	if err != nil {
		return nil, err
	}
	s := &structpb.Struct{}
	if err := protojson.Unmarshal(raw, s); err != nil {
		return nil, err
	}
	return s, nil
}

// DecodePayload reads ev's payload into msg. Fields msg does not know are
// ignored (a newer writer's); a payload of another shape is an error.
func DecodePayload(ev *prpv1.Event, msg proto.Message) error {
	if ev.GetPayload() == nil {
		return nil
	}
	return DecodeStruct(ev.GetPayload(), msg)
}

// DecodeStruct reads s, an object of msg's JSON shape, into msg. Fields
// msg does not know are ignored.
func DecodeStruct(s *structpb.Struct, msg proto.Message) error {
	raw, err := protojson.Marshal(s)
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(raw, msg)
}
