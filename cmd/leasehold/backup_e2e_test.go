package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// TestProcessScheduledBackupCycle runs what deploy/leasehold-backup.service
// runs, four times, against a real server with auth on: `snapshot save
// --keep 2 DIR` with the token in LEASEHOLD_TOKEN_FILE. Each run leaves a
// new checked snapshot holding the leases acquired before it, and only
// the newest two of them; another file in the directory stays.
func TestProcessScheduledBackupCycle(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const token = "backup-token-0123456789abcdef"
	tokens := filepath.Join(dir, "tokens.json")
	writeTokens(t, tokens, false, token)
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "--tokens-file", tokens)
	s.start()
	c, err := client.New([]string{s.http}, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	backups := filepath.Join(dir, "backups")
	if err := os.MkdirAll(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(backups, "leasehold-notes.snap")
	if err := os.WriteFile(other, []byte("not ours"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"LEASEHOLD_ADDR=" + s.http, "LEASEHOLD_TOKEN_FILE=" + tokenFile, "LEASEHOLD_TOKEN="}

	// Without a token the save is refused and writes nothing.
	if out, err := runCLI(t, []string{"LEASEHOLD_ADDR=" + s.http, "LEASEHOLD_TOKEN=", "LEASEHOLD_TOKEN_FILE="},
		"snapshot", "save", "--keep", "2", backups); err == nil {
		t.Fatalf("a save without a token succeeded: %s", out)
	}

	var saved []string
	for i := range 4 {
		if _, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "backup/" + string(rune('a'+i)), Holder: "h", TTLMS: 600000}); err != nil {
			t.Fatal(err)
		}
		out, err := runCLI(t, env, "snapshot", "save", "--keep", "2", "--json", backups)
		if err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
		var res struct {
			File    string   `json:"file"`
			Deleted []string `json:"deleted"`
			State   struct {
				ActiveLeases int `json:"active_leases"`
			} `json:"state"`
		}
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("save %d output %q: %v", i, out, err)
		}
		if filepath.Dir(res.File) != backups || !strings.HasPrefix(filepath.Base(res.File), "leasehold-") {
			t.Fatalf("save %d wrote %q", i, res.File)
		}
		if res.State.ActiveLeases != i+1 {
			t.Fatalf("save %d holds %d active leases, want %d", i, res.State.ActiveLeases, i+1)
		}
		saved = append(saved, res.File)
		wantDeleted := []string(nil)
		if i >= 2 {
			wantDeleted = []string{saved[i-2]}
		}
		if !slices.Equal(res.Deleted, wantDeleted) {
			t.Fatalf("save %d deleted %q, want %q", i, res.Deleted, wantDeleted)
		}
		// What the timer's service checks after saving.
		if out, err := runCLI(t, nil, "snapshot", "inspect", res.File); err != nil || !strings.Contains(out, "sha256") {
			t.Fatalf("inspect %s: %v\n%s", res.File, err, out)
		}
	}

	entries, err := os.ReadDir(backups)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, filepath.Join(backups, e.Name()))
	}
	want := []string{other, saved[2], saved[3]}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("backup directory holds %q, want %q", names, want)
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != "not ours" {
		t.Fatalf("another file of the directory changed: %q %v", b, err)
	}

	// --keep on a file is refused; a file target still works as before.
	if _, err := runCLI(t, env, "snapshot", "save", "--keep", "2", saved[3]); err == nil {
		t.Fatal("--keep with a file target was accepted")
	}
	single := filepath.Join(dir, "one.snap")
	if _, err := runCLI(t, env, "snapshot", "save", single); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI(t, nil, "snapshot", "inspect", single); err != nil {
		t.Fatal(err)
	}
}
