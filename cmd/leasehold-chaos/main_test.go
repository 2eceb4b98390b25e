package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
)

func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
		stdout string
	}{
		{[]string{"--scenario", "nope"}, 2, `no scenario "nope"`, ""},
		{[]string{"--tier", "moon"}, 2, `unknown tier "moon"`, ""},
		{[]string{"--list"}, 0, "", "partition-leader"},
		{[]string{"--list"}, 0, "", "restore-lost-leader"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`, ""},
		{[]string{"--nope"}, 2, "flag provided but not defined", ""},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), c.args, &out, &errb)
		if code != c.code || !strings.Contains(errb.String(), c.stderr) || !strings.Contains(out.String(), c.stdout) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d with %q / %q", c.args, code, out.String(), errb.String(), c.code, c.stdout, c.stderr)
		}
	}
}

// TestServerLinksNoSuite: the server binary links neither the chaos suite
// nor its linearizability checker (they are this command's).
func TestServerLinksNoSuite(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/leasehold/leasehold/cmd/leasehold").Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := string(out)
	if !strings.Contains(deps, "github.com/leasehold/leasehold/node") {
		t.Fatal("go list names no node package: the check looks in the wrong place")
	}
	for _, bad := range []string{"porcupine", "github.com/leasehold/leasehold/chaos\n"} {
		if strings.Contains(deps, bad) {
			t.Errorf("the server binary links %s", strings.TrimSpace(bad))
		}
	}
}
