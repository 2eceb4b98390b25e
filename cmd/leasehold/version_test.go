package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestStampedVersion(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-24T14:00:00Z"}}
	dirty := append(vcs[:2:2], debug.BuildSetting{Key: "vcs.modified", Value: "true"})
	tests := []struct {
		name, ver, rev string
		bi             debug.BuildInfo
		wantVer        string
		wantRev        string
	}{
		{"ldflags win", "v1.2.3", "abc", debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"}, Settings: vcs}, "v1.2.3", "abc"},
		{"module version", "", "", debug.BuildInfo{Main: debug.Module{Version: "v1.0.1-0.20261124140000-0123456789ab"}, Settings: vcs}, "v1.0.1-0.20261124140000-0123456789ab", "0123456789abcdef0123"},
		{"vcs only", "", "", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs}, "v0.0.0-20261124140000-0123456789ab", "0123456789abcdef0123"},
		{"vcs dirty", "", "", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: dirty}, "v0.0.0-20261124140000-0123456789ab+dirty", "0123456789abcdef0123-dirty"},
		{"nothing known", "", "", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel", "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, r := stampedVersion(tt.ver, tt.rev, &tt.bi)
			if v != tt.wantVer || r != tt.wantRev {
				t.Errorf("got %q %q, want %q %q", v, r, tt.wantVer, tt.wantRev)
			}
		})
	}
}

// TestVersionStampedByLdflags builds the binary the way the Makefile does and
// checks `leasehold version` prints what was stamped.
func TestVersionStampedByLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "leasehold")
	out, err := goBuild("-ldflags", "-X main.version=v7.8.9-test -X main.commit=feedc0ffee", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "leasehold v7.8.9-test commit feedc0ffee go") {
		t.Errorf("version printed %q", out)
	}
	out, err = exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v7.8.9-test") {
		t.Errorf("--version: %v %q", err, out)
	}
}

// TestVersionUnstampedIsNotDevel: a build without -ldflags inside the git
// checkout knows its revision (from the build info), and says so.
func TestVersionUnstampedIsNotDevel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skip("not in a git checkout")
	}
	// Go stamps VCS information only where .git is a directory: not in a
	// `git worktree` checkout (.git is a file there).
	if fi, err := os.Stat(filepath.Join(strings.TrimSpace(string(top)), ".git")); err != nil || !fi.IsDir() {
		t.Skip("a git worktree: go build records no VCS information here")
	}
	bin := filepath.Join(t.TempDir(), "leasehold")
	// -buildvcs=true: GOFLAGS may turn VCS stamping off.
	if out, err := goBuild("-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "devel") || strings.Contains(string(out), "commit unknown") {
		t.Errorf("unstamped build in a git checkout printed %q", out)
	}
}
