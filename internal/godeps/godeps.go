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
	tool := goTool()
	if tool == "" {
		t.Skip("no go tool on PATH or in GOROOT")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool, "list", "-deps", pkg).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
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
