package api

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// httpStatuses names the net/http status constants an error answer may be
// written with; a site using another fails the test until it is added here.
var httpStatuses = map[string]int{
	"StatusBadRequest":            http.StatusBadRequest,
	"StatusUnauthorized":          http.StatusUnauthorized,
	"StatusForbidden":             http.StatusForbidden,
	"StatusNotFound":              http.StatusNotFound,
	"StatusMethodNotAllowed":      http.StatusMethodNotAllowed,
	"StatusConflict":              http.StatusConflict,
	"StatusGone":                  http.StatusGone,
	"StatusRequestEntityTooLarge": http.StatusRequestEntityTooLarge,
	"StatusPreconditionRequired":  http.StatusPreconditionRequired,
	"StatusTooManyRequests":       http.StatusTooManyRequests,
	"StatusInternalServerError":   http.StatusInternalServerError,
	"StatusServiceUnavailable":    http.StatusServiceUnavailable,
	"StatusGatewayTimeout":        http.StatusGatewayTimeout,
}

// TestErrorSitesAgreeWithTable: where the package writes a status next to
// a literal error of a known code (writeErrorBody(w, http.StatusX,
// &wire.Error{Code: wire.CodeY}), or return http.StatusX, &wire.Error{...}),
// the status is the one wire's table gives the code. There is one table;
// this keeps the sites that name a status directly from drifting from it.
func TestErrorSitesAgreeWithTable(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	sites := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		check := func(list []ast.Expr) {
			for i := 0; i+1 < len(list); i++ {
				status, ok := httpStatusOf(list[i])
				if !ok {
					continue
				}
				cname, ok := literalCode(list[i+1])
				if !ok {
					continue
				}
				sites++
				code, ok := codeConsts[cname]
				if !ok {
					t.Errorf("%s: %s is not a code of wire.Codes()", fset.Position(list[i+1].Pos()), cname)
					continue
				}
				want, known := httpStatuses[status]
				if !known {
					t.Errorf("%s: http.%s is not in httpStatuses", fset.Position(list[i].Pos()), status)
					continue
				}
				if got := wire.HTTPStatus(code); got != want {
					t.Errorf("%s: http.%s (%d) with %s, wire's table says %d", fset.Position(list[i].Pos()), status, want, code, got)
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				check(n.Args)
			case *ast.ReturnStmt:
				check(n.Results)
			}
			return true
		})
	}
	if sites == 0 {
		t.Fatal("found no status-and-error site; the pattern this test looks for changed")
	}
	t.Logf("%d sites checked", sites)
}

// httpStatusOf returns X for the expression http.X.
func httpStatusOf(e ast.Expr) (string, bool) {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return "", false
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok || pkg.Name != "http" || !strings.HasPrefix(sel.Sel.Name, "Status") {
		return "", false
	}
	return sel.Sel.Name, true
}

// literalCode returns the constant's name CodeX of &wire.Error{Code:
// wire.CodeX, ...}.
func literalCode(e ast.Expr) (string, bool) {
	u, ok := e.(*ast.UnaryExpr)
	if !ok || u.Op != token.AND {
		return "", false
	}
	cl, ok := u.X.(*ast.CompositeLit)
	if !ok {
		return "", false
	}
	for _, el := range cl.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		if k, ok := kv.Key.(*ast.Ident); !ok || k.Name != "Code" {
			continue
		}
		sel, ok := kv.Value.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		return sel.Sel.Name, true
	}
	return "", false
}

// codeConsts maps the names of the code constants to their values.
var codeConsts = func() map[string]wire.Code {
	m := map[string]wire.Code{}
	for _, c := range wire.Codes() {
		// CODE_NAME -> CodeCodeName
		var b strings.Builder
		b.WriteString("Code")
		for _, w := range strings.Split(string(c), "_") {
			b.WriteString(w[:1] + strings.ToLower(w[1:]))
		}
		m[b.String()] = c
	}
	return m
}()
