package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// errFSM fails every command (an entry that does not decode).
type errFSM struct{ countFSM }

func (f *errFSM) Apply(l *raft.Log) any {
	if l.Type == raft.LogCommand {
		return errors.New("does not decode")
	}
	return nil
}

// TestOfflineReplayAndRecover, on both log stores: a running server's
// directory is refused; a stopped one replays every command and its
// configuration; a replay that fails an entry is reported; Recover leaves
// the server the one voter (at the address given), its state whole, and it
// leads alone when started again.
func TestOfflineReplayAndRecover(t *testing.T) {
	for _, store := range []string{LogStoreBoltDB, LogStoreWAL} {
		t.Run(store, func(t *testing.T) {
			dir := t.TempDir()
			cfg := Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", Bootstrap: true, LogStore: store}
			c, err := Open(cfg, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			waitLeader(t, c)
			// Another server, absent: the recovery leaves it out.
			if err := c.raft.AddNonvoter("b", "127.0.0.1:1", 0, time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if err := c.raft.Apply([]byte("x"), time.Second).Error(); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := OpenOffline(dir, nil); err == nil || !strings.Contains(err.Error(), "locked") {
				t.Fatalf("OpenOffline of a running server's directory: %v", err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}

			od, err := OpenOffline(dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			if od.LogStore() != store {
				t.Fatalf("log store %s, want %s", od.LogStore(), store)
			}
			if _, err := od.Replay(&errFSM{}); err == nil {
				t.Fatal("a replay whose entries fail reported no error")
			}
			f := &countFSM{}
			rep, err := od.Replay(f)
			if err != nil {
				t.Fatal(err)
			}
			if f.n.Load() != 5 || len(rep.Configuration.Servers) != 2 || rep.Index == 0 {
				t.Fatalf("replay: %d commands, %+v", f.n.Load(), rep)
			}
			self := Server{ID: "a", Address: "127.0.0.1:2"}
			backup, err := od.Recover(self, &countFSM{})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(backup, "recover-backup-") {
				t.Fatalf("backup %q", backup)
			}
			if err := od.Close(); err != nil {
				t.Fatal(err)
			}

			f2 := &countFSM{}
			c2, err := Open(Config{NodeID: "a", Dir: dir, BindAddr: "127.0.0.1:0", LogStore: store}, f2)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			waitLeader(t, c2)
			conf, err := c2.Configuration()
			if err != nil {
				t.Fatal(err)
			}
			if len(conf.Servers) != 1 || conf.Servers[0].ID != "a" || conf.Servers[0].Address != self.Address || !conf.Servers[0].Voter {
				t.Fatalf("configuration after the recovery: %+v", conf.Servers)
			}
			// The state came back from the recovery's snapshot (countFSM's
			// snapshot is empty: the count is not restored), and the log
			// goes on above the replayed index.
			if err := c2.raft.Apply([]byte("y"), time.Second).Error(); err != nil {
				t.Fatal(err)
			}
			if c2.LastIndex() <= rep.Index {
				t.Fatalf("last index %d after the recovery, not above %d", c2.LastIndex(), rep.Index)
			}
		})
	}
}
