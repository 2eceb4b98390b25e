package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	raftwal "github.com/hashicorp/raft-wal"
)

func watchNode(timeout time.Duration) *Node {
	return &Node{cfg: Config{LogFailureTimeout: timeout}, log: slog.New(slog.DiscardHandler), logs: newLogWatch(0, slog.New(slog.DiscardHandler), nil)}
}

func failed(n *Node) bool {
	select {
	case <-n.Failed():
		return true
	default:
		return false
	}
}

// raft-wal's sealed segment never takes an append again: the node fails
// as soon as the disk has room for a restart, not before.
func TestLogWatchSealedFailsOnceRoomReturns(t *testing.T) {
	n := watchNode(0)
	w := n.logs
	// raft.LogCache quotes the error instead of wrapping it.
	w.record(fmt.Errorf("unable to store logs within log store, err: %q", raftwal.ErrSealed))
	if err := n.HealthErr(); err == nil || !strings.Contains(err.Error(), "segment is sealed") {
		t.Fatalf("HealthErr while failing: %v", err)
	}
	w.check(n.log, n.cfg.logFailureTimeout(), 10<<20, RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed with no room on the disk")
	}
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	if !failed(n) {
		t.Fatal("not failed once the disk has room")
	}
	if err := n.FailedErr(); err == nil || !strings.Contains(err.Error(), "restart") {
		t.Fatalf("FailedErr: %v", err)
	}
}

// Any other error that outlasts the disk's room coming back by
// logRecoverGrace fails the node; a success in between clears it all.
func TestLogWatchOtherErrorsAfterGrace(t *testing.T) {
	n := watchNode(0)
	w := n.logs
	w.record(syscall.ENOSPC)
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed at once on an error that may pass")
	}
	w.roomSince.Store(time.Now().Add(-logRecoverGrace - time.Second).UnixNano())
	w.lastFailure.Store(time.Now().Add(-logRecoverGrace - 2*time.Second).UnixNano())
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed without a failure since the room came back")
	}
	w.record(syscall.ENOSPC)
	w.record(nil)
	if n.HealthErr() != nil {
		t.Fatalf("HealthErr after a success: %v", n.HealthErr())
	}
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed after a success")
	}
	w.record(errors.New("input/output error"))
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	w.roomSince.Store(time.Now().Add(-logRecoverGrace - time.Second).UnixNano())
	w.record(errors.New("input/output error"))
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk, RestartFreeDisk)
	if !failed(n) {
		t.Fatal("not failed after the grace with room on the disk")
	}
}

// With no room, the node fails after LogFailureTimeout of failures (never
// when it is negative).
func TestLogWatchTimeout(t *testing.T) {
	for _, tc := range []struct {
		timeout time.Duration
		want    bool
	}{{0, true}, {time.Minute, true}, {-1, false}} {
		n := watchNode(tc.timeout)
		w := n.logs
		w.record(syscall.ENOSPC)
		w.check(n.log, n.cfg.logFailureTimeout(), 0, RestartFreeDisk)
		if failed(n) {
			t.Fatalf("timeout %v: failed at once", tc.timeout)
		}
		w.failingSince.Store(time.Now().Add(-DefaultLogFailureTimeout - time.Second).UnixNano())
		w.check(n.log, n.cfg.logFailureTimeout(), 0, RestartFreeDisk)
		if failed(n) != tc.want {
			t.Fatalf("timeout %v: failed %v, want %v", tc.timeout, failed(n), tc.want)
		}
		if tc.want && !strings.Contains(n.FailedErr().Error(), "--log-failure-timeout") {
			t.Fatalf("FailedErr: %v", n.FailedErr())
		}
	}
}

// failingStable fails every write.
type failingStable struct{ raft.StableStore }

func (failingStable) Set([]byte, []byte) error       { return syscall.EIO }
func (failingStable) SetUint64([]byte, uint64) error { return syscall.EIO }

// When hashicorp/raft's setCurrentTerm cannot save a new term, instead
// of returning into its panic the node fails, saying why, and the calling
// goroutine is held until the node closes, then ends without returning.
// The term written by anyone else (a live bootstrap), and other keys (a
// vote, which Raft handles), get their error back.
func TestLogWatchStableTermFailureFailsNode(t *testing.T) {
	released := make(chan struct{})
	n := watchNode(0)
	n.logs = newLogWatch(0, slog.New(slog.DiscardHandler), released)
	_, st := n.logs.wrap(nil)(nil, failingStable{})

	saver := false
	old := termSaver
	termSaver = func() bool { return saver }
	t.Cleanup(func() { termSaver = old })
	if err := st.SetUint64(keyCurrentTerm, 7); !errors.Is(err, syscall.EIO) || failed(n) {
		t.Fatalf("the term, not from setCurrentTerm: err %v, failed %v; want EIO back and no failure", err, failed(n))
	}
	saver = true
	if err := st.SetUint64([]byte("LastVoteTerm"), 7); !errors.Is(err, syscall.EIO) || failed(n) {
		t.Fatalf("a vote's term: err %v, failed %v; want EIO back and no failure", err, failed(n))
	}
	if err := st.Set([]byte("LastVoteCand"), []byte("n2")); !errors.Is(err, syscall.EIO) || failed(n) {
		t.Fatalf("a vote's candidate: err %v, failed %v; want EIO back and no failure", err, failed(n))
	}

	returned := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		st.SetUint64(keyCurrentTerm, 8)
		close(returned) // never: the goroutine ends inside the call
	}()
	select {
	case <-n.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not fail when its term could not be saved")
	}
	if err := n.FailedErr(); err == nil || !strings.Contains(err.Error(), "current term 8") || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("FailedErr %v: want the term and the disk's error", err)
	}
	select {
	case <-ended:
		t.Fatal("the goroutine went on before the node closed")
	case <-time.After(50 * time.Millisecond):
	}
	close(released)
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the held goroutine did not end once the node closed")
	}
	select {
	case <-returned:
		t.Fatal("the call returned (into Raft's panic) instead of ending its goroutine")
	default:
	}
}

// recordingStable records, for each write of the term, whether termSaver
// saw hashicorp/raft's setCurrentTerm making it.
type recordingStable struct {
	raft.StableStore
	mu    sync.Mutex
	saver []bool
}

func (r *recordingStable) SetUint64(key []byte, val uint64) error {
	if string(key) == string(keyCurrentTerm) {
		r.mu.Lock()
		r.saver = append(r.saver, termSaver())
		r.mu.Unlock()
	}
	return r.StableStore.SetUint64(key, val)
}

// termSaver knows the Raft this builds with: a one-server Raft bootstrapped
// (the term written by BootstrapCluster, not setCurrentTerm) that elects
// itself (setCurrentTerm) is told apart.
func TestTermSaverSeesRaft(t *testing.T) {
	store := raft.NewInmemStore()
	rec := &recordingStable{StableStore: store}
	snaps := raft.NewInmemSnapshotStore()
	addr, trans := raft.NewInmemTransport("a")
	conf := raft.DefaultConfig()
	conf.LocalID = "a"
	conf.LogOutput = io.Discard
	if err := raft.BootstrapCluster(conf, store, rec, snaps, trans,
		raft.Configuration{Servers: []raft.Server{{ID: "a", Address: addr}}}); err != nil {
		t.Fatal(err)
	}
	r, err := raft.NewRaft(conf, &raft.MockFSM{}, store, rec, snaps, trans)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { r.Shutdown().Error() }()
	waitFor(t, 30*time.Second, func() bool { return r.State() == raft.Leader })
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.saver) < 2 || rec.saver[0] || !rec.saver[len(rec.saver)-1] {
		t.Fatalf("termSaver for each write of the term (bootstrap first, then the election's): %v; "+
			"want false, then true (has hashicorp/raft renamed setCurrentTerm?)", rec.saver)
	}
}

// A restart needs room for one new raft-wal segment and a margin: 65 MiB
// with raft-wal's segments, less with a test's smaller ones.
func TestRestartFreeDisk(t *testing.T) {
	c := Config{}
	if got := c.restartFreeDisk(); got != RestartFreeDisk {
		t.Errorf("default: %d, want %d", got, RestartFreeDisk)
	}
	c.WALSegmentSize = 8 << 20
	if got := c.restartFreeDisk(); got != 9<<20 {
		t.Errorf("8 MiB segments: %d, want %d", got, 9<<20)
	}
}
