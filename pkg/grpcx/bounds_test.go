package grpcx

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	backupv1 "github.com/tether-run/tether/pkg/gen/tether/backup/v1"
	executorv1 "github.com/tether-run/tether/pkg/gen/tether/executor/v1"
	gatewayv1 "github.com/tether-run/tether/pkg/gen/tether/gateway/v1"
)

// structuredFields are the request fields whose values are free-form
// (google.protobuf.Struct/Value): protovalidate cannot bound their strings,
// so each is depth- and size-checked where it is admitted (SPEC T6). A new
// free-form field must be added here, with its check.
var structuredFields = []string{
	"tether.prp.v1.DynamicTool.input_schema",                     // admission.CheckStructure at submit
	"tether.executor.v1.ResolveRuntimeRequestRequest.resolution", // api: structure checked before dispatch
	"tether.prp.v1.Command.payload",                              // executor-built commands (grant-authorised)
	"tether.prp.v1.RequestResolve.resolution",                    // api: structure checked before dispatch
	"tether.prp.v1.ToolResult.content_items",                     // executor-built commands (grant-authorised)
	// Built by the executor and the gateway (mTLS peers), bounded by the
	// message size; never taken from a client request.
	"tether.backup.v1.ExecutionIdentity.provider",
	"tether.backup.v1.ProviderSessionIdentity.provider_session_identity",
}

// TestT6_EveryRequestStringFieldHasALengthBound walks the request messages
// of every public service from their descriptors and fails for any string
// field (plain, repeated item, map key or value) without a length bound
// (max_len, max_bytes, len, const or an in-list), and for any free-form
// Struct field not listed in structuredFields.
func TestT6_EveryRequestStringFieldHasALengthBound(t *testing.T) {
	t.Parallel()
	services := []protoreflect.ServiceDescriptor{
		executorv1.File_tether_executor_v1_executor_proto.Services().ByName("ExecutorService"),
		executorv1.File_tether_executor_v1_fleet_proto.Services().ByName("GatewayRegistry"),
		gatewayv1.File_tether_gateway_v1_gateway_proto.Services().ByName("RunnerGateway"),
		backupv1.File_tether_backup_v1_backup_proto.Services().ByName("BackupVerifier"),
	}
	seen := map[protoreflect.FullName]bool{}
	var unbounded []string
	for _, sd := range services {
		if sd == nil {
			t.Fatal("a service descriptor is missing")
		}
		for i := range sd.Methods().Len() {
			unbounded = append(unbounded, unboundedStrings(sd.Methods().Get(i).Input(), seen)...)
		}
	}
	if len(seen) < 20 {
		t.Fatalf("walked only %d request messages", len(seen))
	}
	for _, u := range unbounded {
		t.Errorf("request field without a length bound: %s", u)
	}
	for _, f := range structuredFields {
		if !structuredSeen[f] {
			t.Errorf("structuredFields names %s, which no request carries", f)
		}
	}
}

// structuredSeen records the free-form fields the walk met (written by the
// one test that walks).
var structuredSeen = map[string]bool{}

func unboundedStrings(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]bool) []string {
	if seen[md.FullName()] || md.FullName().Parent() == "google.protobuf" {
		return nil
	}
	seen[md.FullName()] = true
	var out []string
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		rules, _ := proto.GetExtension(fd.Options(), validate.E_Field).(*validate.FieldRules)
		name := string(fd.FullName())
		switch {
		case fd.IsMap():
			if fd.MapKey().Kind() == protoreflect.StringKind && !stringBounded(rules.GetMap().GetKeys().GetString()) {
				out = append(out, name+" (map key)")
			}
			out = append(out, checkValue(fd.MapValue(), rules.GetMap().GetValues(), name+" (map value)", seen)...)
		case fd.IsList():
			out = append(out, checkValue(fd, rules.GetRepeated().GetItems(), name+" (item)", seen)...)
		default:
			out = append(out, checkValue(fd, rules, name, seen)...)
		}
	}
	return out
}

func checkValue(fd protoreflect.FieldDescriptor, rules *validate.FieldRules, name string, seen map[protoreflect.FullName]bool) []string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !stringBounded(rules.GetString()) {
			return []string{name}
		}
	case protoreflect.BytesKind:
		if r := rules.GetBytes(); !r.HasMaxLen() && !r.HasLen() {
			return []string{name + " (bytes)"}
		}
	case protoreflect.MessageKind:
		m := fd.Message()
		if m.FullName().Parent() == "google.protobuf" {
			switch m.FullName().Name() {
			case "Struct", "Value", "ListValue":
				structuredSeen[string(fd.FullName())] = true
				if !slices.Contains(structuredFields, string(fd.FullName())) {
					return []string{fmt.Sprintf("%s (free-form %s not in structuredFields)", name, m.FullName().Name())}
				}
			}
			return nil
		}
		return unboundedStrings(m, seen)
	}
	return nil
}

func stringBounded(r *validate.StringRules) bool {
	return r.HasMaxLen() || r.HasMaxBytes() || r.HasLen() || r.HasLenBytes() || r.HasConst() || len(r.GetIn()) > 0 ||
		boundedPattern(r.GetPattern())
}

// boundedPattern is an anchored pattern without an open-ended repetition
// (e.g. ^[0-9a-f]{64}$): it bounds the length by itself.
func boundedPattern(p string) bool {
	return strings.HasPrefix(p, "^") && strings.HasSuffix(p, "$") && !strings.ContainsAny(p, "*+") && !strings.Contains(p, ",}")
}
