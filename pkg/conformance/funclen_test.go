package conformance

import (
	"fmt"
	"go/ast"
	"go/token"
	"testing"

	"github.com/stretchr/testify/require"
)

// Length limits of production Go functions, in lines from the func
// keyword to the closing brace: a longer function is a story told by
// comments that its named steps should tell instead (docs/STYLE: a complex
// operation is a type, one method per step).
const (
	maxFuncLines = 100
	// maxRunLines bounds `run` of a main package: flags → config → wiring
	// → serving, each a call (issue #34).
	maxRunLines = 60
)

// No function of the repository's non-test, non-generated Go code is over
// maxFuncLines lines, and no main package's run over maxRunLines.
func TestConformance_NoFunctionIsOverItsLengthLimit(t *testing.T) {
	t.Parallel()
	var over []string
	walkProduction(t, ".", func(rel string, fset *token.FileSet, f *ast.File) {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line + 1
			limit := maxFuncLines
			if f.Name.Name == "main" && fn.Recv == nil && fn.Name.Name == "run" {
				limit = maxRunLines
			}
			if lines > limit {
				over = append(over, fmt.Sprintf("%s:%d %s: %d lines (limit %d)", rel, fset.Position(fn.Pos()).Line, funcName(fn), lines, limit))
			}
		}
	})
	require.Empty(t, over, "functions over their length limit: split them into named steps")
}

// funcName is fn's name with its receiver's type: "(*Gateway).Attach".
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	recv := fn.Recv.List[0].Type
	star := ""
	if s, ok := recv.(*ast.StarExpr); ok {
		star, recv = "*", s.X
	}
	if ix, ok := recv.(*ast.IndexExpr); ok { // a generic receiver
		recv = ix.X
	}
	if id, ok := recv.(*ast.Ident); ok {
		return "(" + star + id.Name + ")." + fn.Name.Name
	}
	return fn.Name.Name
}
