package grpcx

import (
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tether-run/tether/pkg/failure"
)

// A request that does not decode (a string field that is not valid UTF-8,
// or messages nested deeper than the decoder allows) fails inside grpc-go
// before any interceptor runs, as a bare Internal status naming no field.
// The server's codec (Codec) instead finds the offending field, empties the
// request and marks it with the reason in an unknown field of its own
// number; the first interceptor after the peer check refuses a marked
// request with InvalidArgument invalid_request naming the field (SPEC T6).

// undecodableField is the field number of the mark (the largest a message
// may carry; no tether message uses it). A client sending it only gets its
// own request refused.
const undecodableField protowire.Number = protowire.MaxValidNumber

// decodeDepthLimit is the decoder's nesting limit (protobuf-go's default
// recursion limit).
const decodeDepthLimit = 10000

// maxPathElems bounds the field path named in a refusal (a 20,000-deep
// Struct would otherwise name 40,000 elements).
const maxPathElems = 8

// Codec returns the proto codec every tether server decodes requests with
// (installed by New; a service forcing its own codec wraps this one).
func Codec() encoding.CodecV2 { return checkedCodec{encoding.GetCodecV2(grpcproto.Name)} }

type checkedCodec struct{ encoding.CodecV2 }

func (c checkedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	b := data.Materialize()
	path, reason := undecodable(b, m.ProtoReflect().Descriptor(), nil, 1)
	if reason == "" {
		return err
	}
	proto.Reset(m)
	mark := protowire.AppendTag(nil, undecodableField, protowire.BytesType)
	mark = protowire.AppendString(mark, renderPath(path)+": "+reason)
	m.ProtoReflect().SetUnknown(mark)
	return nil
}

// undecodable walks b as a message of md and returns the path of the first
// string field that is not valid UTF-8 or of the first message nested deeper
// than decodeDepthLimit, with why; "" when it finds neither.
func undecodable(b []byte, md protoreflect.MessageDescriptor, path []string, depth int) ([]string, string) {
	if depth > decodeDepthLimit {
		return path, "nested deeper than " + strconv.Itoa(decodeDepthLimit) + " messages"
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, ""
		}
		b = b[n:]
		// The path is kept to maxPathElems+1 elements: copying it whole at
		// every level made a 20,000-deep request quadratic.
		here := path
		if len(path) <= maxPathElems {
			here = append(path[:len(path):len(path)], string(fd.Name()))
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return here, "not valid UTF-8"
			}
		case protoreflect.MessageKind, protoreflect.GroupKind:
			if fd.IsMap() {
				here = path // a map entry is not a level of the caller's path
			}
			if p, why := undecodable(v, fd.Message(), here, depth+1); why != "" {
				return p, why
			}
		}
	}
	return nil, ""
}

func renderPath(path []string) string {
	if len(path) == 0 {
		return "request"
	}
	if len(path) > maxPathElems {
		return strings.Join(path[:maxPathElems], ".") + "..."
	}
	return strings.Join(path, ".")
}

// markedReason returns the reason Codec marked req with, or "".
func markedReason(req any) string {
	m, ok := req.(proto.Message)
	if !ok {
		return ""
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == undecodableField && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(b)
			return strings.ToValidUTF8(string(v), "?")
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

func undecodableError(reason string) error {
	if len(reason) > 512 {
		reason = reason[:512]
	}
	return failure.New(codes.InvalidArgument, failure.InvalidRequest, "%s", reason)
}

func unaryUndecodable(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if r := markedReason(req); r != "" {
		return nil, undecodableError(r)
	}
	return handler(ctx, req)
}

func streamUndecodable(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, undecodableStream{ss})
}

type undecodableStream struct{ grpc.ServerStream }

func (s undecodableStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if r := markedReason(m); r != "" {
		return undecodableError(r)
	}
	return nil
}
