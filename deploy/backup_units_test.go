package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitValues returns the values of key= in a systemd unit file, in order.
func unitValues(t *testing.T, file, key string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestBackupUnits: the backup timer starts the backup service, which saves
// with retention into a directory and gets its token through
// LEASEHOLD_TOKEN_FILE (a systemd credential), never on its command line;
// systemd-analyze, where installed, finds nothing to say about either
// unit. cmd/leasehold's TestProcessScheduledBackupCycle runs the command.
func TestBackupUnits(t *testing.T) {
	const svc, timer = "leasehold-backup.service", "leasehold-backup.timer"
	if got := unitValues(t, timer, "Unit"); len(got) != 1 || got[0] != svc {
		t.Errorf("%s: Unit=%q, want %s", timer, got, svc)
	}
	if got := unitValues(t, timer, "Persistent"); len(got) != 1 || got[0] != "true" {
		t.Errorf("%s: Persistent=%q, want true (a run missed while off happens at boot)", timer, got)
	}
	exec_ := unitValues(t, svc, "ExecStart")
	if len(exec_) != 1 || !strings.Contains(exec_[0], "leasehold snapshot save --keep ") {
		t.Fatalf("%s: ExecStart=%q", svc, exec_)
	}
	if strings.Contains(exec_[0], "--token") || strings.Contains(exec_[0], "LEASEHOLD_TOKEN=") {
		t.Errorf("%s: the token is on the command line: %q", svc, exec_[0])
	}
	var tokenFile bool
	for _, e := range unitValues(t, svc, "Environment") {
		if strings.HasPrefix(e, "LEASEHOLD_TOKEN_FILE=%d/") {
			tokenFile = true
		}
		if strings.HasPrefix(e, "LEASEHOLD_TOKEN=") {
			t.Errorf("%s: Environment=%s puts the token in the environment", svc, e)
		}
	}
	if !tokenFile || len(unitValues(t, svc, "LoadCredential")) != 1 {
		t.Errorf("%s: want the token as a credential (LoadCredential=) named by LEASEHOLD_TOKEN_FILE=%%d/...", svc)
	}
	if got := unitValues(t, svc, "Type"); len(got) != 1 || got[0] != "oneshot" {
		t.Errorf("%s: Type=%q, want oneshot", svc, got)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed")
	}
	// verify wants ExecStart's binary to exist: point it at one that does.
	dir := t.TempDir()
	for _, f := range []string{svc, timer} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		data = []byte(strings.ReplaceAll(string(data), "/usr/local/bin/leasehold", "/bin/true"))
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(analyze, "verify", "./"+timer, "./"+svc)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
