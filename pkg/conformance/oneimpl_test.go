package conformance

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// walkProduction calls visit with every parsed non-test, non-generated Go
// file of the repository (third_party, pkg/gen and testdata aside) whose
// path, relative to the repository root, starts with under.
func walkProduction(t *testing.T, under string, visit func(rel string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	fset := token.NewFileSet()
	err := filepath.WalkDir(filepath.Join(repoRoot, under), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		if d.IsDir() {
			switch {
			case rel == "third_party", rel == filepath.Join("pkg", "gen"), strings.HasPrefix(d.Name(), ".") && rel != ".",
				d.Name() == "node_modules", d.Name() == "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !ast.IsGenerated(f) {
			visit(rel, fset, f)
		}
		return nil
	})
	require.NoError(t, err)
}

// groupControl lists where f starts a process group of its own (a
// Setpgid field) or signals a whole group (a kill of a negated pid).
func groupControl(rel string, fset *token.FileSet, f *ast.File) []string {
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.KeyValueExpr:
			if id, ok := n.Key.(*ast.Ident); ok && id.Name == "Setpgid" {
				found = append(found, fmt.Sprintf("%s:%d Setpgid", rel, fset.Position(n.Pos()).Line))
			}
		case *ast.SelectorExpr:
			if n.Sel.Name == "Setpgid" {
				found = append(found, fmt.Sprintf("%s:%d .Setpgid", rel, fset.Position(n.Pos()).Line))
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Kill" || len(n.Args) != 2 {
				return true
			}
			if u, ok := n.Args[0].(*ast.UnaryExpr); ok && u.Op == token.SUB {
				found = append(found, fmt.Sprintf("%s:%d a group kill", rel, fset.Position(n.Pos()).Line))
			}
		}
		return true
	})
	return found
}

// One implementation of process-group spawn and kill (issue #34): only
// pkg/procgroup sets Setpgid or signals a negated pid; the providers, the
// provider host, the gateway's runnerd launch, the runner's orphan kill and
// the test stack use it.
func TestConformance_OneProcessGroupImplementation(t *testing.T) {
	t.Parallel()
	var outside []string
	inside := 0
	walkProduction(t, ".", func(rel string, fset *token.FileSet, f *ast.File) {
		found := groupControl(rel, fset, f)
		if strings.HasPrefix(rel, filepath.Join("pkg", "procgroup")+string(filepath.Separator)) {
			inside += len(found)
			return
		}
		outside = append(outside, found...)
	})
	require.Positive(t, inside, "pkg/procgroup starts and signals groups (the rule sees it)")
	require.Empty(t, outside, "process groups are started and signalled by pkg/procgroup only")
}

// jsonrpcEnvelope lists where f writes or reads the JSON-RPC envelope
// itself: a "jsonrpc" member (a map key or a struct tag).
func jsonrpcEnvelope(rel string, fset *token.FileSet, f *ast.File) []string {
	var found []string
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.KeyValueExpr:
			if lit, ok := n.Key.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, _ := strconv.Unquote(lit.Value); v == "jsonrpc" {
					found = append(found, fmt.Sprintf("%s:%d \"jsonrpc\" key", rel, fset.Position(n.Pos()).Line))
				}
			}
		case *ast.Field:
			if n.Tag == nil {
				return true
			}
			tag, _ := strconv.Unquote(n.Tag.Value)
			if name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ","); name == "jsonrpc" {
				found = append(found, fmt.Sprintf("%s:%d jsonrpc field", rel, fset.Position(n.Pos()).Line))
			}
		}
		return true
	})
	return found
}

// One implementation of JSON-RPC framing in runnerd (issue #34): only
// internal/jsonrpc holds the envelope; the codex and ACP drivers and the
// provider host use it. The fakes under internal/testing play the
// provider's side and frame by hand on purpose: a second, independent
// reading of the protocol is what tests the drivers' framing.
func TestConformance_OneJSONRPCFraming(t *testing.T) {
	t.Parallel()
	runnerd := filepath.Join("services", "runnerd")
	var outside []string
	inside := 0
	walkProduction(t, runnerd, func(rel string, fset *token.FileSet, f *ast.File) {
		found := jsonrpcEnvelope(rel, fset, f)
		switch {
		case strings.HasPrefix(rel, filepath.Join(runnerd, "internal", "jsonrpc")+string(filepath.Separator)):
			inside += len(found)
		case strings.HasPrefix(rel, filepath.Join(runnerd, "internal", "testing")+string(filepath.Separator)):
		default:
			outside = append(outside, found...)
		}
	})
	require.Positive(t, inside, "internal/jsonrpc holds the envelope (the rule sees it)")
	require.Empty(t, outside, "runnerd frames JSON-RPC in internal/jsonrpc only")
}

// One provider contract in runnerd (issue #34): the drivers implement
// package provider's interface themselves and import neither the runner
// (their consumer) nor each other; runnerd's main only names them in its
// registry (providers.go), with no adapter of its own.
func TestConformance_OneProviderContract(t *testing.T) {
	t.Parallel()
	const internal = "github.com/tether-run/tether/services/runnerd/internal/"
	drivers := []string{"codex", "acp", "opencode"}
	runnerd := filepath.Join("services", "runnerd")
	var wrong []string
	walkProduction(t, runnerd, func(rel string, _ *token.FileSet, f *ast.File) {
		dir := filepath.ToSlash(filepath.Dir(rel))
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			target, ok := strings.CutPrefix(path, internal)
			if !ok {
				continue
			}
			for _, d := range drivers {
				from := "services/runnerd/internal/" + d
				switch {
				case dir == from && (target == "runner" || (target != d && slices.Contains(drivers, target))):
					wrong = append(wrong, rel+" imports "+target)
				case dir == "services/runnerd/cmd/runnerd" && target == d && filepath.Base(rel) != "providers.go":
					wrong = append(wrong, rel+" imports driver "+d+" (only the registry, providers.go, names drivers)")
				}
			}
		}
	})
	require.Empty(t, wrong)
}
