package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise the module version or VCS revision from the build info is used.
var version = ""

func versionString() string {
	v := version
	var rev, dirty string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "-dirty"
				}
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " (" + rev + dirty + ")"
	}
	return v + " " + runtime.Version()
}

func (a *app) versionCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("version", "", "Print the version.")
	if _, err := a.parse(fs, args, nil, 0); err != nil {
		return err
	}
	_, err := fmt.Fprintln(a.stdout, "leasehold", versionString())
	return err
}
