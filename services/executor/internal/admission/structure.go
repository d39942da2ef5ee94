package admission

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
	"github.com/tether-run/tether/pkg/workspace"
)

// CheckWorkspace refuses a workspace.cwd outside the workspace root of the
// run's company (workspace.Check; root "" is workspace.DefaultRoot). The
// gateway that creates the directory resolves it again (workspace.Confine).
func CheckWorkspace(in *prpv1.ExecutionInput, root string) error {
	if root == "" {
		root = workspace.DefaultRoot
	}
	err := workspace.Check(root, in.GetBinding().GetCompanyId(), in.GetWorkspace().GetCwd())
	if e, ok := err.(*failure.Error); ok {
		e.Metadata = map[string]string{MetadataField: "input.workspace.cwd"}
	}
	return err
}

// Free-form request values (a tool's input_schema, a runtime request's
// resolution) are checked here, at submit or before dispatch, because
// protovalidate cannot bound what a google.protobuf.Struct holds (SPEC T6).
const (
	// MaxStructDepth is how deeply a free-form value may nest (objects and
	// arrays). The runner refuses a command nested deeper than
	// digest.MaxJSONDepth (64); a run.attach command wraps a tool's schema
	// in five levels of its own, so a deeper schema was accepted at submit
	// and failed inside the run (command_invalid).
	MaxStructDepth = 32
	// MaxSchemaBytes bounds one tool's input_schema (its wire size).
	MaxSchemaBytes = 64 << 10
	// MaxResolutionBytes bounds a runtime request's resolution.
	MaxResolutionBytes = 64 << 10
)

// CheckStructures refuses an input whose free-form values nest deeper than
// MaxStructDepth or are larger than their bound: InvalidArgument
// invalid_request naming the field.
func CheckStructures(in *prpv1.ExecutionInput) error {
	for i, t := range in.GetDynamicTools() {
		field := fmt.Sprintf("input.dynamic_tools[%d].input_schema", i)
		if err := CheckStruct(field, t.GetInputSchema(), MaxSchemaBytes); err != nil {
			return err
		}
	}
	return nil
}

// CheckStruct refuses s when it nests deeper than MaxStructDepth or its wire
// size exceeds maxBytes.
func CheckStruct(field string, s *structpb.Struct, maxBytes int) error {
	if s == nil {
		return nil
	}
	if n := proto.Size(s); n > maxBytes {
		return structError(field, "is %d bytes, more than %d", n, maxBytes)
	}
	if !structWithin(s, MaxStructDepth) {
		return structError(field, "nests deeper than %d levels", MaxStructDepth)
	}
	return nil
}

func structError(field, format string, args ...any) error {
	err := failure.New(codes.InvalidArgument, failure.InvalidRequest, field+": "+format, args...)
	err.Metadata = map[string]string{MetadataField: field}
	return err
}

// structWithin reports whether s (one level) and everything in it nest at
// most depth levels; it stops descending as soon as the bound is passed.
func structWithin(s *structpb.Struct, depth int) bool {
	if depth < 1 {
		return false
	}
	for _, v := range s.GetFields() {
		if !valueWithin(v, depth-1) {
			return false
		}
	}
	return true
}

func valueWithin(v *structpb.Value, depth int) bool {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StructValue:
		return structWithin(k.StructValue, depth)
	case *structpb.Value_ListValue:
		if depth < 1 {
			return false
		}
		for _, e := range k.ListValue.GetValues() {
			if !valueWithin(e, depth-1) {
				return false
			}
		}
	}
	return true
}
