package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// leaseSnap is what must come back after a restore.
type leaseSnap struct {
	ID, Key, Holder, State, SessionID string
	Fence                             uint64
	TTLMS                             int64
}

func allLeases(t *testing.T, n *Node) map[string]leaseSnap {
	t.Helper()
	out := map[string]leaseSnap{}
	after := ""
	for {
		page, err := n.ListLeases(context.Background(), wire.ListRequest{After: after, Limit: 1000}, false)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		for _, l := range page.Leases {
			out[l.LeaseID] = leaseSnap{l.LeaseID, l.Key, l.Holder, l.State, l.SessionID, l.FencingToken, l.TTLMS}
		}
		if page.Next == "" {
			return out
		}
		after = page.Next
	}
}

func saveSnapshot(t *testing.T, n *Node) ([]byte, *SnapshotInfo) {
	t.Helper()
	var buf bytes.Buffer
	info, err := n.SaveSnapshot(context.Background(), &buf)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	return buf.Bytes(), info
}

// fence reads the state machine's fencing counter: the highest token granted.
func (n *Node) fenceForTest() uint64 {
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	return n.rep.f.Fence()
}

func TestSnapshotSaveRestore(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	n := openNode(t, cfg)
	ctx := context.Background()

	a, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "a", TTLMS: 60000, Metadata: map[string]string{"x": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := n.CreateSession(ctx, wire.SessionRequest{Holder: "s", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	bound, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/2", SessionID: sess.SessionID, SessionToken: sess.Token})
	if err != nil {
		t.Fatal(err)
	}
	ended, _, _ := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/3", Holder: "c", TTLMS: 60000})
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: ended.LeaseID, Token: ended.Token}); err != nil {
		t.Fatal(err)
	}

	file, info := saveSnapshot(t, n)
	saved := allLeases(t, n)
	if len(saved) != 3 {
		t.Fatalf("saved %d leases, want 3", len(saved))
	}
	if info.Format != SnapshotFileFormat || info.Index == 0 || info.Term == 0 || info.NodeID != "n1" ||
		info.Size <= 0 || info.CreatedAt.IsZero() {
		t.Fatalf("info %+v", info)
	}
	check, body, err := ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(check, info) {
		t.Fatalf("file header %+v, save answered %+v", check, info)
	}
	raw := file[len(file)-int(info.Size):]
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != info.SHA256 {
		t.Fatal("sha256 in the header is not the body's")
	}
	if _, err := bytes.NewBuffer(nil).ReadFrom(body); err != nil {
		t.Fatalf("verify body: %v", err)
	}

	// Change everything: release, acquire, and grant many leases in
	// concurrent batches so the fencing counter runs ahead of the log index.
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: a.LeaseID, Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.EndSession(ctx, sess.SessionID, sess.Token, false); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var issued []uint64
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("after/", i), Holder: "b", TTLMS: 60000})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			issued = append(issued, l.FencingToken)
			mu.Unlock()
		}()
	}
	wg.Wait()
	taken, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "d", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	issued = append(issued, taken.FencingToken)
	maxBefore := n.fenceForTest()
	for _, f := range issued {
		if f > maxBefore {
			t.Fatalf("token %d above the fencing counter %d", f, maxBefore)
		}
	}
	t.Logf("fencing counter %d at log index %d before the restore", maxBefore, n.cl.LastIndex())

	live, err := n.Subscribe(ctx, wire.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	lastBefore := n.AppliedIndex()
	indexBefore := n.cl.LastIndex()

	got, err := n.RestoreSnapshot(ctx, bytes.NewReader(file))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if got.Index != info.Index || got.SHA256 != info.SHA256 || got.RestoredIndex <= indexBefore || got.State == nil ||
		got.State.ActiveLeases != 2 || got.State.ActiveSessions != 1 {
		t.Fatalf("restore answered %+v (state %+v), index before %d", got, got.State, indexBefore)
	}
	if n.AppliedIndex() < lastBefore {
		t.Fatalf("applied index went back: %d < %d", n.AppliedIndex(), lastBefore)
	}

	if got.Kept != 201 || got.Refenced != 1 || got.Superseded != 1 {
		t.Fatalf("restore kept %d, re-fenced %d, superseded %d leases; want 201, 1, 1", got.Kept, got.Refenced, got.Superseded)
	}

	// A restore never goes backwards. What was live just before it is as
	// it was: cam/1 stays with taken, the leases granted since the save
	// stay, with their tokens.
	now := allLeases(t, n)
	for id, l := range now {
		if l.State != "active" || l.Holder != "b" && l.Holder != "d" {
			continue
		}
		if f := l.Fence; f > maxBefore {
			t.Fatalf("lease %s live before the restore has fence %d, above the counter before %d", id, f, maxBefore)
		}
	}
	if l := now[taken.LeaseID]; l.State != "active" || l.Fence != taken.FencingToken {
		t.Fatalf("the lease on cam/1 live before the restore: %+v", l)
	}
	if _, err := n.Renew(ctx, taken.LeaseID, taken.Token, 0); err != nil {
		t.Fatalf("renew the lease live before the restore: %v", err)
	}
	// a, of the file, does not come back on cam/1: taken holds it.
	if l := now[a.LeaseID]; l.State != "revoked" || l.Fence != saved[a.LeaseID].Fence {
		t.Fatalf("lease a after the restore: %+v", l)
	}
	if v, err := n.Validate(ctx, wire.ValidateRequest{Key: "cam/1", FencingToken: a.FencingToken}); err != nil || v.Valid {
		t.Fatalf("a's token after the restore: %v %+v", err, v)
	}
	if _, err := n.Renew(ctx, a.LeaseID, a.Token, 0); wire.ErrorCode(err) != wire.CodeLeaseRevoked {
		t.Fatalf("renew a after the restore: %v", err)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "e", TTLMS: 60000}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire of a key held before the restore: %v", err)
	}
	// The session ended since the save comes back, with its lease on a
	// free key, re-fenced above every token issued before; its token works
	// again.
	if s, err := n.GetSession(ctx, sess.SessionID, false); err != nil || s.State != "active" {
		t.Fatalf("session after restore: %v %+v", err, s)
	}
	gotB, err := n.GetLease(ctx, bound.LeaseID, false)
	if err != nil || gotB.State != "active" || gotB.FencingToken <= maxBefore {
		t.Fatalf("bound lease after restore: %v %+v (tokens before up to %d)", err, gotB, maxBefore)
	}
	if v, err := n.Validate(ctx, wire.ValidateRequest{Key: "cam/2", FencingToken: bound.FencingToken}); err != nil || v.Valid {
		t.Fatalf("the bound lease's old token after the restore: %v %+v", err, v)
	}
	if _, err := n.SessionHeartbeat(ctx, sess.SessionID, sess.Token); err != nil {
		t.Fatalf("heartbeat the restored session: %v", err)
	}
	if l := now[ended.LeaseID]; l.State != "released" {
		t.Fatalf("lease ended before the save: %+v", l)
	}

	// Fencing tokens never go back.
	fresh, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "new/0", Holder: "f", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if fresh.FencingToken <= gotB.FencingToken {
		t.Fatalf("fencing token %d after the restore, %d was granted before", fresh.FencingToken, gotB.FencingToken)
	}
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: taken.LeaseID, Token: taken.Token}); err != nil {
		t.Fatal(err)
	}
	again, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "cam/1", Holder: "g", TTLMS: 60000})
	if err != nil || again.FencingToken <= fresh.FencingToken {
		t.Fatalf("reacquire after restore: %v %+v", err, again)
	}

	// Live streams end (the state they followed is gone); resuming from
	// before the restore is refused; new events have higher ids.
	deadline := time.After(5 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-live.Events():
		case <-deadline:
			t.Fatal("live subscription did not end at the restore")
		}
	}
	if wire.ErrorCode(live.Err()) != wire.CodeEventsCompacted {
		t.Fatalf("live subscription ended with %v", live.Err())
	}
	if _, err := n.Subscribe(ctx, wire.EventFilter{AfterIndex: lastBefore}); wire.ErrorCode(err) != wire.CodeEventsCompacted {
		t.Fatalf("resume from before the restore: %v", err)
	}
	sub, err := n.Subscribe(ctx, wire.EventFilter{FromStart: true, Key: "cam/1"})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	select {
	case ev := <-sub.Events():
		if ev.Index <= indexBefore {
			t.Fatalf("event %s after the restore, log was at %d before", ev.ID, indexBefore)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event after the restore")
	}

	// The restored state, with its raised fencing counter, is what a
	// restart comes back to.
	n.Close()
	n2 := openNode(t, cfg)
	if l, err := n2.GetLease(ctx, again.LeaseID, false); err != nil || l.FencingToken != again.FencingToken {
		t.Fatalf("after restart: %v %+v", err, l)
	}
	after, _, err := n2.Acquire(ctx, wire.AcquireRequest{Key: "new/1", Holder: "h", TTLMS: 60000})
	if err != nil || after.FencingToken <= again.FencingToken {
		t.Fatalf("acquire after restart: %v %+v", err, after)
	}
}

// TestSnapshotRestoreRefusesBadFiles: nothing changes unless the whole file
// checks out.
func TestSnapshotRestoreRefusesBadFiles(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k", Holder: "a", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	file, info := saveSnapshot(t, n)
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "k2", Holder: "a", TTLMS: 60000}); err != nil {
		t.Fatal(err)
	}
	before := allLeases(t, n)
	fenceBefore := n.fenceForTest()

	hdrLen := len(file) - int(info.Size)
	garbage := []byte("this is not a state machine snapshot at all")
	sum := sha256.Sum256(garbage)
	garbageFile := fmt.Sprintf("LEASEHOLD-SNAPSHOT\n1\n{\"index\":5,\"term\":1,\"node_id\":\"x\",\"size\":%d,\"sha256\":%q}\n%s",
		len(garbage), hex.EncodeToString(sum[:]), garbage)
	flip := func(i int) []byte {
		b := bytes.Clone(file)
		b[i] ^= 0x40
		return b
	}
	cases := map[string][]byte{
		"empty":              nil,
		"wrong magic":        append([]byte("NOT-A-SNAPSHOT\n"), file[len("LEASEHOLD-SNAPSHOT\n"):]...),
		"wrong version":      bytes.Replace(file, []byte("LEASEHOLD-SNAPSHOT\n1\n"), []byte("LEASEHOLD-SNAPSHOT\n9\n"), 1),
		"bad header":         bytes.Replace(file, []byte(`"size"`), []byte(`"size`), 1),
		"header only":        file[:hdrLen],
		"truncated":          file[:len(file)-10],
		"trailing data":      append(bytes.Clone(file), 'x'),
		"corrupted body":     flip(hdrLen + int(info.Size)/2),
		"corrupted last":     flip(len(file) - 1),
		"bad checksum":       bytes.Replace(file, []byte(info.SHA256), []byte(strings.Repeat("0", 64)), 1),
		"wrong size":         bytes.Replace(file, fmt.Appendf(nil, `"size":%d`, info.Size), fmt.Appendf(nil, `"size":%d`, info.Size+1), 1),
		"undecodable body":   []byte(garbageFile),
		"no header newline":  []byte("LEASEHOLD-SNAPSHOT\n1\n{}"),
		"long header":        append([]byte("LEASEHOLD-SNAPSHOT\n1\n"), bytes.Repeat([]byte(" "), 70<<10)...),
		"negative size":      []byte("LEASEHOLD-SNAPSHOT\n1\n{\"size\":-1,\"sha256\":\"" + strings.Repeat("0", 64) + "\"}\n"),
		"short sha":          []byte("LEASEHOLD-SNAPSHOT\n1\n{\"size\":1,\"sha256\":\"00\"}\nx"),
		"missing format row": append([]byte("LEASEHOLD-SNAPSHOT\n"), file[len("LEASEHOLD-SNAPSHOT\n1\n"):]...),
	}
	for name, b := range cases {
		_, err := n.RestoreSnapshot(ctx, bytes.NewReader(b))
		if wire.ErrorCode(err) != wire.CodeInvalidArgument {
			t.Errorf("%s: %v, want INVALID_ARGUMENT", name, err)
			continue
		}
		if _, ierr := InspectSnapshotFile(bytes.NewReader(b)); wire.ErrorCode(ierr) != wire.CodeInvalidArgument {
			t.Errorf("%s: inspect says %v", name, ierr)
		}
		t.Logf("%s: %v", name, err)
	}
	if now := allLeases(t, n); !reflect.DeepEqual(now, before) {
		t.Fatalf("state changed by refused restores:\n%v\nwant\n%v", now, before)
	}
	if f := n.fenceForTest(); f != fenceBefore {
		t.Fatalf("fencing counter changed: %d -> %d", fenceBefore, f)
	}
	// The untouched file is still good.
	if got, err := InspectSnapshotFile(bytes.NewReader(file)); err != nil || got.State.ActiveLeases != 1 {
		t.Fatalf("inspect: %v %+v", err, got)
	}
}

// TestSnapshotRestoreQueuedAcquires: queued acquires in the file are
// withdrawn, and an acquire waiting here is answered at once.
func TestSnapshotRestoreQueuedAcquires(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	ctx := context.Background()
	held, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "a", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *wire.Lease
		err error
	}
	waited := make(chan result, 1)
	go func() {
		l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "b", TTLMS: 60000, WaitMS: 60000})
		waited <- result{l, err}
	}()
	waitFor(t, 5*time.Second, func() bool {
		n.waits.mu.Lock()
		defer n.waits.mu.Unlock()
		return len(n.waits.m) == 1
	})
	waitFor(t, 5*time.Second, func() bool { // the busy answer counts the queue
		_, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "probe", TTLMS: 60000})
		return err != nil && strings.Contains(err.Error(), "1 acquires are queued")
	})
	file, _ := saveSnapshot(t, n)
	info, err := n.RestoreSnapshot(ctx, bytes.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if info.DroppedWaits != 1 {
		t.Fatalf("dropped %d queued acquires, want 1", info.DroppedWaits)
	}
	select {
	case r := <-waited:
		if wire.ErrorCode(r.err) != wire.CodeUnavailable {
			t.Fatalf("waiting acquire got %v %+v, want UNAVAILABLE", r.err, r.l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting acquire was not answered by the restore")
	}
	// Releasing the slot hands it to nobody: the queue is empty.
	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: held.LeaseID, Token: held.Token}); err != nil {
		t.Fatal(err)
	}
	if active, err := n.ListLeases(ctx, wire.ListRequest{Key: "q", State: "active"}, false); err != nil || len(active.Leases) != 0 {
		t.Fatalf("active after release: %v %+v", err, active)
	}
	if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "q", Holder: "c", TTLMS: 60000}); err != nil {
		t.Fatalf("acquire of the freed key: %v", err)
	}
}

// TestSnapshotRestoreAcrossNodes: a file saved by one cluster restores into
// another with the same tick period, and is refused by one with another.
func TestSnapshotRestoreAcrossNodes(t *testing.T) {
	ctx := context.Background()
	src := openNode(t, testConfig(t, ""))
	l, _, err := src.Acquire(ctx, wire.AcquireRequest{Key: "moved", Holder: "a", TTLMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	file, _ := saveSnapshot(t, src)

	dst := openNode(t, testConfig(t, ""))
	for i := range 3 {
		if _, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprint("old/", i), Holder: "b", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
	}
	fenceBefore := dst.fenceForTest()
	if _, err := dst.RestoreSnapshot(ctx, bytes.NewReader(file)); err != nil {
		t.Fatal(err)
	}
	// The moved lease is active with a token above every token of this
	// cluster; the leases live here before the restore are kept.
	got, err := dst.GetLease(ctx, l.LeaseID, false)
	if err != nil || got.State != "active" || got.FencingToken <= fenceBefore {
		t.Fatalf("moved lease: %v %+v (tokens before: up to %d)", err, got, fenceBefore)
	}
	if _, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: "old/0", Holder: "c", TTLMS: 60000}); wire.ErrorCode(err) != wire.CodeLeaseHeld {
		t.Fatalf("acquire of a key held before the restore: %v", err)
	}
	if nl, _, err := dst.Acquire(ctx, wire.AcquireRequest{Key: "new/0", Holder: "c", TTLMS: 60000}); err != nil || nl.FencingToken <= got.FencingToken {
		t.Fatalf("acquire after restore: %v %+v (moved: %d)", err, nl, got.FencingToken)
	}

	cfg := testConfig(t, "")
	cfg.TickPeriod = 30 * time.Millisecond
	other := openNode(t, cfg)
	if _, err := other.RestoreSnapshot(ctx, bytes.NewReader(file)); wire.ErrorCode(err) != wire.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "tick period") {
		t.Fatalf("restore with another tick period: %v", err)
	}
}

// TestSnapshotSaveTwice: saving twice in a row works (a barrier gives Raft
// something new to snapshot).
func TestSnapshotSaveTwice(t *testing.T) {
	n := openNode(t, testConfig(t, ""))
	a, _ := saveSnapshot(t, n)
	b, _ := saveSnapshot(t, n)
	if len(a) == 0 || len(b) == 0 {
		t.Fatal("empty snapshot")
	}
	if _, err := InspectSnapshotFile(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
}

// A saved file's header gives the size and SHA-256 of the body that
// follows (recorded when Raft's snapshot was written, not computed again),
// for every snapshot in a row, with automatic snapshots in between.
func TestSaveSnapshotHeaderMatchesBody(t *testing.T) {
	n := openNode(t, testConfig(t, t.TempDir()))
	ctx := context.Background()
	for i := range 6 {
		if _, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("cam/%d", i), Holder: "a", TTLMS: 60000}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if err := n.cl.Snapshot().Error(); err != nil {
				t.Fatal(err)
			}
		}
		file, info := saveSnapshot(t, n)
		got, body, err := wire.ReadSnapshotFile(bytes.NewReader(file))
		if err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
		b, err := io.ReadAll(body)
		if err != nil {
			t.Fatalf("save %d: the body does not match its header: %v", i, err)
		}
		sum := sha256.Sum256(b)
		if int64(len(b)) != info.Size || hex.EncodeToString(sum[:]) != info.SHA256 || got.SHA256 != info.SHA256 {
			t.Fatalf("save %d: body of %d bytes, sha256 %x; info says %d, %s; header %s", i, len(b), sum, info.Size, info.SHA256, got.SHA256)
		}
	}
}

func TestSnapshotSums(t *testing.T) {
	var ss snapshotSums
	if _, ok := ss.get(""); ok {
		t.Fatal("the empty id has a sum")
	}
	for i := range 6 {
		ss.put(fmt.Sprint(i), snapshotSum{size: int64(i)})
	}
	for i := range 6 {
		sum, ok := ss.get(fmt.Sprint(i))
		if want := i >= 2; ok != want || (ok && sum.size != int64(i)) {
			t.Errorf("id %d: %+v, %v; want it kept: %v", i, sum, ok, want)
		}
	}
	// An id written again (an in-memory store's term-index): the newest.
	ss.put("3", snapshotSum{size: 30})
	if sum, _ := ss.get("3"); sum.size != 30 {
		t.Errorf("id 3 written again: got size %d, want the newest, 30", sum.size)
	}
}
