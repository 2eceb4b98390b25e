package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCompletionCoversCommands: every command of the table is offered, a
// command listed with subcommands accepts each with a flag set of its own,
// and every other command makes a flag set when run with -h (one that made
// none would take subcommands missing from the list).
func TestCompletionCoversCommands(t *testing.T) {
	script := bashCompletion()
	top := regexp.MustCompile(`(?m)^        words="([^"]*)"$`).FindStringSubmatch(script)
	if top == nil {
		t.Fatal("no list of commands in the script")
	}
	offered := strings.Fields(top[1])
	for _, c := range commands() {
		if !slices.Contains(offered, c.name) {
			t.Errorf("command %s missing from the script", c.name)
		}
		subs, ok := subcommands[c.name]
		if !ok {
			if _, made := commandFlags(c); !made {
				t.Errorf("%s -h makes no flag set: a command with subcommands not in the list?", c.name)
			}
			if !strings.Contains(script, "            "+c.name+"/*)\n                flags=") {
				t.Errorf("no flags arm for %s", c.name)
			}
			continue
		}
		for _, s := range subs {
			if _, made := commandFlags(c, s); !made {
				t.Errorf("%s %s -h makes no flag set: not a subcommand?", c.name, s)
			}
			if !strings.Contains(script, "            "+c.name+"/"+s+")\n") {
				t.Errorf("no arm for %s %s", c.name, s)
			}
		}
	}
	// Flags of the real flag sets, with whether they take a value.
	var save []completionFlag
	for _, c := range commands() {
		if c.name == "snapshot" {
			save, _ = commandFlags(c, "save")
		}
	}
	if !slices.Contains(save, completionFlag{name: "keep", value: true}) || !slices.Contains(save, completionFlag{name: "json", value: false}) {
		t.Fatalf("snapshot save flags: %v", save)
	}
}

// complete runs the bash completion function on words (the last one being
// completed) and returns what it offers.
func complete(t *testing.T, script string, words ...string) []string {
	t.Helper()
	var quoted []string
	for _, w := range words {
		quoted = append(quoted, "'"+w+"'")
	}
	prog := "source " + script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\n" +
		"COMP_CWORD=" + strconv.Itoa(len(words)-1) + "\n_leasehold\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
	out, err := exec.Command("bash", "--norc", "--noprofile", "-c", prog).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			got = append(got, l)
		}
	}
	return got
}

// TestCompletionScripts: both scripts parse (bash -n, zsh -n where zsh is
// installed), zsh sources its script cleanly, and bash's completes
// commands, subcommands and flags, and leaves flag values and arguments to
// file name completion.
func TestCompletionScripts(t *testing.T) {
	dir := t.TempDir()
	write := func(shell string) string {
		a, out, errb := testApp(nil)
		if err := a.run(context.Background(), []string{"completion", shell}); err != nil {
			t.Fatalf("completion %s: %v %s", shell, err, errb)
		}
		p := filepath.Join(dir, "leasehold."+shell)
		if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bashScript := write("bash")
	if out, err := exec.Command("bash", "-n", bashScript).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"leasehold", "sess"}, []string{"session"}},
		{[]string{"leasehold", "--addr", "h:7700", "comp"}, []string{"completion"}},
		{[]string{"leasehold", "snapshot", ""}, []string{"save", "restore", "inspect", "downgrade"}},
		{[]string{"leasehold", "snapshot", "save", "--ke"}, []string{"--keep"}},
		{[]string{"leasehold", "server", "--reload-i"}, []string{"--reload-interval"}},
		{[]string{"leasehold", "--json", "session", "create", "--hol"}, []string{"--holder"}},
		{[]string{"leasehold", "server", "--tokens-file", ""}, nil},
		{[]string{"leasehold", "snapshot", "inspect", ""}, nil},
	} {
		if got := complete(t, bashScript, tc.words...); !slices.Equal(got, tc.want) {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}

	if a, _, _ := testApp(nil); a.run(context.Background(), []string{"completion", "fish"}) == nil {
		t.Error("completion fish accepted")
	}
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Skip("zsh not installed (Debian package zsh)")
	}
	zshScript := write("zsh")
	if out, err := exec.Command(zsh, "-n", zshScript).CombinedOutput(); err != nil {
		t.Fatalf("zsh -n: %v\n%s", err, out)
	}
	cmd := exec.Command(zsh, "-f", "-c", "source "+zshScript+" && (( $+functions[_leasehold] )) && echo loaded")
	cmd.Env = append(os.Environ(), "HOME="+dir, "ZDOTDIR="+dir)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "loaded" {
		t.Fatalf("zsh sourcing the script: %v\n%s", err, out)
	}
}
