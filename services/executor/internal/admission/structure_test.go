package admission

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tether-run/tether/pkg/failure"
	prpv1 "github.com/tether-run/tether/pkg/gen/tether/prp/v1"
)

func nested(depth int, list bool) *structpb.Struct {
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"type": structpb.NewStringValue("object")}}
	for range depth - 1 {
		v := structpb.NewStructValue(s)
		if list {
			v = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{v}})
			s = &structpb.Struct{Fields: map[string]*structpb.Value{"items": v}}
			continue
		}
		s = &structpb.Struct{Fields: map[string]*structpb.Value{"properties": v}}
	}
	return s
}

func TestT6_CheckStructBoundsDepthAndSize(t *testing.T) {
	t.Parallel()
	big := &structpb.Struct{Fields: map[string]*structpb.Value{"d": structpb.NewStringValue(strings.Repeat("x", MaxSchemaBytes))}}
	for name, tc := range map[string]struct {
		s  *structpb.Struct
		ok bool
	}{
		"nil":               {nil, true},
		"flat":              {nested(1, false), true},
		"deepest admitted":  {nested(MaxStructDepth, false), true},
		"one level deeper":  {nested(MaxStructDepth+1, false), false},
		"500 deep":          {nested(500, false), false},
		"3000 deep":         {nested(3000, false), false},
		"lists count":       {nested(MaxStructDepth/2+1, true), false},
		"lists within":      {nested(MaxStructDepth/2, true), true},
		"larger than bound": {big, false},
	} {
		err := CheckStruct("input_schema", tc.s, MaxSchemaBytes)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", name, err, tc.ok)
		}
		if err != nil && (failure.CodeOf(err) != failure.InvalidRequest || !strings.Contains(err.Error(), "input_schema")) {
			t.Errorf("%s: %v", name, err)
		}
	}
	in := &prpv1.ExecutionInput{Provider: &prpv1.Provider{Kind: "codex"},
		DynamicTools: []*prpv1.DynamicTool{{Name: "a"}, {Name: "b", InputSchema: nested(500, false)}}}
	if err := Check(in); err == nil || !strings.Contains(err.Error(), "input.dynamic_tools[1].input_schema") {
		t.Fatalf("Check: %v", err)
	}
}

func TestT6_CheckWorkspaceNamesTheField(t *testing.T) {
	t.Parallel()
	in := &prpv1.ExecutionInput{Binding: &prpv1.Binding{CompanyId: "acme"}, Workspace: &prpv1.Workspace{Cwd: "/any/path"}}
	err := CheckWorkspace(in, "/srv/ws")
	if failure.CodeOf(err) != failure.WorkspaceOutsideRoot {
		t.Fatalf("%v", err)
	}
	in.Workspace.Cwd = "/srv/ws/acme/repo"
	if err := CheckWorkspace(in, "/srv/ws"); err != nil {
		t.Fatal(err)
	}
	if err := CheckWorkspace(in, ""); failure.CodeOf(err) != failure.WorkspaceOutsideRoot {
		t.Fatalf("the default root admitted %s: %v", in.Workspace.Cwd, err)
	}
}
