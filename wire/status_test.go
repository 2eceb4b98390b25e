package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/godeps"
)

// contractTable is the error table of the external contract
// (CONTRACT.md, "Error codes"), status by code, as binding there.
var contractTable = map[Code]int{
	"INVALID_ARGUMENT":     400,
	"UNAUTHENTICATED":      401,
	"PERMISSION_DENIED":    403,
	"LEASE_TOKEN_INVALID":  403,
	"LEASE_NOT_FOUND":      404,
	"SESSION_NOT_FOUND":    404,
	"LEASE_HELD":           409,
	"LIMIT_MISMATCH":       409,
	"LOCK_DELAY":           409,
	"LEASE_EXPIRED":        409,
	"LEASE_RELEASED":       409,
	"LEASE_REVOKED":        409,
	"SESSION_ENDED":        409,
	"IDEMPOTENCY_CONFLICT": 409,
	"PAYLOAD_TOO_LARGE":    413,
	"LEASE_REQUIRED":       428,
	"CONTROL_LOCKED":       409,
	"NO_LEADER":            503,
	"INDETERMINATE":        504,
	// In the contract's route table rather than its error table.
	"EVENTS_COMPACTED": 410,
}

func TestStatusTableCoversContract(t *testing.T) {
	for code, want := range contractTable {
		if !Known(code) {
			t.Errorf("contract code %s is not in the table", code)
		}
		if got := HTTPStatus(code); got != want {
			t.Errorf("HTTPStatus(%s) = %d, contract says %d", code, got, want)
		}
	}
	if got := HTTPStatus("NOT_A_CODE"); got != 500 {
		t.Errorf("HTTPStatus(unknown) = %d, want 500", got)
	}
	if got := HTTPStatus(""); got != 500 {
		t.Errorf("HTTPStatus(\"\") = %d, want 500", got)
	}
}

// TestEveryCodeInTable: every Code constant declared in this package has a
// status, so a new code cannot be answered as 500 INTERNAL by accident.
func TestEveryCodeInTable(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for i := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s: not a string literal", vs.Names[i].Name)
				}
				v, _ := strconv.Unquote(lit.Value)
				n++
				if !Known(Code(v)) {
					t.Errorf("%s (%s) has no status in the table", vs.Names[i].Name, v)
				}
			}
		}
	}
	if n == 0 || n != len(Codes()) {
		t.Errorf("declared %d codes, the table has %d", n, len(Codes()))
	}
}

// TestStatusTableMatchesDocs: the API reference (docs/api.md) lists every
// code with the status the table gives it, and no other.
func TestStatusTableMatchesDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("^\\| (\\d{3}) \\| (`[A-Z_]+`.*?) \\|")
	codeRe := regexp.MustCompile("`([A-Z_]+)`")
	documented := map[Code]int{}
	for _, line := range strings.Split(string(b), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		status, _ := strconv.Atoi(m[1])
		for _, c := range codeRe.FindAllStringSubmatch(m[2], -1) {
			documented[Code(c[1])] = status
		}
	}
	if len(documented) < len(contractTable) {
		t.Fatalf("docs/api.md: found %d codes in the error table, want at least %d", len(documented), len(contractTable))
	}
	for code, status := range documented {
		if got := HTTPStatus(code); got != status {
			t.Errorf("docs/api.md: %d %s, table %d", status, code, got)
		}
	}
	for _, code := range Codes() {
		if _, ok := documented[code]; !ok && code != CodeInternal {
			t.Errorf("%s (%d) is not in docs/api.md's error table", code, HTTPStatus(code))
		}
	}
}

// TestCodeForStatus: the fallback code of a status maps back to it (but
// 502, which no code has, gives UNAVAILABLE).
func TestCodeForStatus(t *testing.T) {
	for _, s := range []int{400, 401, 403, 404, 413, 503, 504, 500} {
		if got := HTTPStatus(CodeForStatus(s)); got != s {
			t.Errorf("HTTPStatus(CodeForStatus(%d)) = %d", s, got)
		}
	}
	if got := CodeForStatus(502); got != CodeUnavailable {
		t.Errorf("CodeForStatus(502) = %s", got)
	}
	if got := CodeForStatus(418); got != CodeInternal {
		t.Errorf("CodeForStatus(418) = %s", got)
	}
}

// TestStateMachineLinksNoHTTP: wire, and so the state machine that imports
// it for its codes, link no HTTP (and no network at all).
func TestStateMachineLinksNoHTTP(t *testing.T) {
	for _, pkg := range []string{"github.com/leasehold/leasehold/wire", "github.com/leasehold/leasehold/fsm"} {
		deps := godeps.Deps(t, pkg)
		if bad := godeps.Forbidden(deps, []string{"net", "net/http", "github.com/leasehold/leasehold/node"}); len(bad) > 0 {
			t.Errorf("%s links %v", pkg, bad)
		}
		for _, d := range deps {
			first, _, _ := strings.Cut(d, "/")
			if strings.Contains(first, ".") && !strings.HasPrefix(d, "github.com/leasehold/leasehold/") {
				t.Errorf("%s links a third-party package: %s", pkg, d)
			}
		}
	}
}
