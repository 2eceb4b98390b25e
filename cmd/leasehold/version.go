package main

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"
)

// version and commit are stamped at build time (the Makefile does):
//
//	go build -ldflags "-X main.version=$(git describe --tags --always --dirty) -X main.commit=$(git rev-parse HEAD)"
//
// Unstamped, they come from the build info: the module version Go derives
// from the VCS (a tag or a pseudo-version), else one made of the VCS
// revision and time; "devel" only when the build knows no VCS at all (go
// test binaries, -buildvcs=false).
var version, commit string

// buildVersion returns the version and commit of this binary.
func buildVersion() (ver, rev string) {
	ver, rev = version, commit
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = &debug.BuildInfo{}
	}
	return stampedVersion(ver, rev, bi)
}

// stampedVersion fills what -ldflags left empty from bi.
func stampedVersion(ver, rev string, bi *debug.BuildInfo) (string, string) {
	var vcsRev, vcsTime string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			vcsRev = s.Value
		case "vcs.time":
			vcsTime = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		rev = vcsRev
		if rev != "" && dirty {
			rev += "-dirty"
		}
	}
	if ver == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		ver = bi.Main.Version
	}
	if ver == "" && vcsRev != "" {
		// The pseudo-version go would give an untagged commit.
		stamp := "00000000000000"
		if t, err := time.Parse(time.RFC3339, vcsTime); err == nil {
			stamp = t.UTC().Format("20060102150405")
		}
		ver = "v0.0.0-" + stamp + "-" + vcsRev[:min(12, len(vcsRev))]
		if dirty {
			ver += "+dirty"
		}
	}
	ver = cmp.Or(ver, "devel")
	rev = cmp.Or(rev, "unknown")
	return ver, rev
}

func versionString() string {
	ver, rev := buildVersion()
	return fmt.Sprintf("%s commit %s %s", ver, rev, runtime.Version())
}

func (a *app) versionCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("version", "", "Print the version, the commit and the Go version it was built with.")
	asJSON := fs.Bool("json", false, "print JSON")
	if _, err := a.parse(fs, args, nil, 0); err != nil {
		return err
	}
	if *asJSON {
		ver, rev := buildVersion()
		return writeJSON(a.stdout, map[string]string{"version": ver, "commit": rev, "go": runtime.Version()})
	}
	_, err := fmt.Fprintln(a.stdout, "leasehold", versionString())
	return err
}
