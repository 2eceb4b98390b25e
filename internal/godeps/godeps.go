// Package godeps lists what a Go package links, for tests that guard the
// dependency graph (the client must not link the server, the state machine
// must not link net/http).
package godeps

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// goTool returns the go command: the one on PATH (go test puts the running
// toolchain's first), else the one in runtime.GOROOT(); "" if neither.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	if root := runtime.GOROOT(); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return ""
}

// Deps returns every package that pkg (an import path) links, itself
// included, as `go list -deps` prints them. It skips the test only when
// there is no go tool at all; a go tool that fails fails the test.
func Deps(t testing.TB, pkg string) []string {
	t.Helper()
	return strings.Fields(goList(t, "-deps", pkg))
}

// Module is a module of the build graph and the go line of its go.mod.
type Module struct {
	Path, GoVersion string
	Main            bool
}

// Modules returns the main module and every module of its build graph
// (`go list -m all`), skipping and failing as Deps does.
func Modules(t testing.TB) []Module {
	t.Helper()
	var mods []Module
	for line := range strings.Lines(goList(t, "-m", "-f", "{{.Path}} {{.Main}} {{.GoVersion}}", "all")) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		m := Module{Path: f[0], Main: f[1] == "true"}
		if len(f) > 2 {
			m.GoVersion = f[2]
		}
		mods = append(mods, m)
	}
	return mods
}

// goList runs go list with args and returns its output.
func goList(t testing.TB, args ...string) string {
	t.Helper()
	tool := goTool()
	if tool == "" {
		t.Skip("no go tool on PATH or in GOROOT")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, append([]string{"list"}, args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// Forbidden returns the packages of deps that are one of prefixes or
// inside one (prefix "a/b" matches "a/b" and "a/b/c", not "a/bc").
func Forbidden(deps, prefixes []string) []string {
	var bad []string
	for _, d := range deps {
		for _, p := range prefixes {
			if d == p || strings.HasPrefix(d, p+"/") {
				bad = append(bad, d)
				break
			}
		}
	}
	return bad
}
