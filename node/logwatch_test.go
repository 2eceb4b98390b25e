package node

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	raftwal "github.com/hashicorp/raft-wal"
)

func watchNode(timeout time.Duration) *Node {
	return &Node{cfg: Config{LogFailureTimeout: timeout}, log: slog.New(slog.DiscardHandler), logs: newLogWatch(0)}
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
	w.check(n.log, n.cfg.logFailureTimeout(), 10<<20)
	if failed(n) {
		t.Fatal("failed with no room on the disk")
	}
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
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
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed at once on an error that may pass")
	}
	w.roomSince.Store(time.Now().Add(-logRecoverGrace - time.Second).UnixNano())
	w.lastFailure.Store(time.Now().Add(-logRecoverGrace - 2*time.Second).UnixNano())
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed without a failure since the room came back")
	}
	w.record(syscall.ENOSPC)
	w.record(nil)
	if n.HealthErr() != nil {
		t.Fatalf("HealthErr after a success: %v", n.HealthErr())
	}
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
	if failed(n) {
		t.Fatal("failed after a success")
	}
	w.record(errors.New("input/output error"))
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
	w.roomSince.Store(time.Now().Add(-logRecoverGrace - time.Second).UnixNano())
	w.record(errors.New("input/output error"))
	w.check(n.log, n.cfg.logFailureTimeout(), RestartFreeDisk)
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
		w.check(n.log, n.cfg.logFailureTimeout(), 0)
		if failed(n) {
			t.Fatalf("timeout %v: failed at once", tc.timeout)
		}
		w.failingSince.Store(time.Now().Add(-DefaultLogFailureTimeout - time.Second).UnixNano())
		w.check(n.log, n.cfg.logFailureTimeout(), 0)
		if failed(n) != tc.want {
			t.Fatalf("timeout %v: failed %v, want %v", tc.timeout, failed(n), tc.want)
		}
		if tc.want && !strings.Contains(n.FailedErr().Error(), "--log-failure-timeout") {
			t.Fatalf("FailedErr: %v", n.FailedErr())
		}
	}
}
