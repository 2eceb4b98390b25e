package cluster

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestOfflineToolsRefuseARunningOrMissingDataDir: OpenOffline and
// MigrateLog refuse a directory without raft.db, and one whose raft.db is
// locked by a server, each with its message.
func TestOfflineToolsRefuseARunningOrMissingDataDir(t *testing.T) {
	empty := t.TempDir()
	wantMissing := "cluster: " + empty + " has no raft.db: not a data dir ("
	if _, err := OpenOffline(empty, nil); err == nil || !strings.HasPrefix(err.Error(), wantMissing) {
		t.Errorf("OpenOffline of an empty dir = %v, want %q...", err, wantMissing)
	}
	if _, err := MigrateLog(empty, LogStoreWAL, nil); err == nil || !strings.HasPrefix(err.Error(), wantMissing) {
		t.Errorf("MigrateLog of an empty dir = %v, want %q...", err, wantMissing)
	}

	dir := t.TempDir()
	held, _, err := openBolt(filepath.Join(dir, "raft.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.db.Close()
	wantLocked := "cluster: " + filepath.Join(dir, "raft.db") + " is locked: a leasehold server runs on data dir " + dir + "; stop it first"
	if _, err := OpenOffline(dir, nil); err == nil || err.Error() != wantLocked {
		t.Errorf("OpenOffline of a locked dir = %v, want %q", err, wantLocked)
	}
	if _, err := MigrateLog(dir, LogStoreWAL, nil); err == nil || err.Error() != wantLocked+" (the log moves only offline)" {
		t.Errorf("MigrateLog of a locked dir = %v, want %q", err, wantLocked+" (the log moves only offline)")
	}
}
