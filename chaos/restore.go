package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// saveSnapshot saves a snapshot file of the cluster through the leader's
// API, as an operator would (GET /v1/cluster/snapshot).
func (e *Env) saveSnapshot(ctx context.Context) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		l, err := e.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		info, err := e.admin[l].SaveSnapshot(sctx, &buf)
		cancel()
		if err == nil {
			e.Note("snapshot-save", fmt.Sprintf("node %d saved index %d (%d bytes)", l, info.Index, info.Size), nil)
			e.Count("snapshots-saved", 1)
			return buf.Bytes(), nil
		}
		if attempt >= 4 || ctx.Err() != nil {
			return nil, fmt.Errorf("save a snapshot: %w", err)
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// fileLeases decodes a snapshot file and names, per key, the lease it has
// active (the workload's keys have limit 1).
func fileLeases(file []byte) (map[string]string, error) {
	_, body, err := wire.ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		return nil, err
	}
	f := fsm.New()
	if err := f.Restore(body); err != nil {
		return nil, err
	}
	// Every record active and not due: a restore ends what is due in the
	// file (past its TTL, left by a limited tick) before it rebases, so
	// such a lease never comes back.
	ls, _ := f.Leases(fsm.LeaseFilter{})
	out := make(map[string]string, len(ls))
	for _, l := range ls {
		if l.State != fsm.StateActive || f.Due(l) {
			continue
		}
		if strings.HasPrefix(l.Key, padPrefix) {
			continue // padding (padSnapshot): no workload op touches it
		}
		if l.Limit != 1 {
			return nil, fmt.Errorf("lease %s on %s has limit %d: the model knows limit 1 only", l.ID, l.Key, l.Limit)
		}
		out[l.Key] = l.ID
	}
	return out, nil
}

// restoreSnapshot restores file through the leader's API (PUT
// /v1/cluster/snapshot) and records the restore in the history as a
// KRestore operation, for the checkers. A restore is not idempotent: it is
// tried again only after a definite failure (no leader, writes that did not
// pause: nothing changed), at most a few times.
func (e *Env) restoreSnapshot(ctx context.Context, file []byte) error {
	restored, err := fileLeases(file)
	if err != nil {
		return fmt.Errorf("read the snapshot file: %w", err)
	}
	for attempt := 1; ; attempt++ {
		l, err := e.WaitLeader(ctx, 10*time.Second)
		if err != nil {
			return err
		}
		op, err := e.restoreAttempt(ctx, l, file, restored, 20*time.Second)
		switch {
		case err == nil:
			return nil
		case op.Status == StatusFail && (op.Code == string(wire.CodeNoLeader) || op.Code == string(wire.CodeUnavailable)) && attempt < 5:
			e.Note("snapshot-restore", fmt.Sprintf("node %d, attempt %d: nothing changed; trying again", l, attempt), err)
			if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
				return err
			}
		default:
			e.Note("snapshot-restore", fmt.Sprintf("node %d, attempt %d", l, attempt), err)
			return fmt.Errorf("restore: %w", err)
		}
	}
}

// restoreAttempt restores file once through node l's API, records it in
// the history as a KRestore operation, and returns the operation.
func (e *Env) restoreAttempt(ctx context.Context, l int, file []byte, restored map[string]string, timeout time.Duration) (Op, error) {
	op := Op{Process: e.H.NewProcess(), Worker: -1, Node: l, Kind: KRestore, Restored: restored}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	op.Call = e.H.Now()
	info, err := e.admin[l].RestoreSnapshot(rctx, bytes.NewReader(file))
	op.Return = e.H.Now()
	cancel()
	op.Status, op.Code, op.Err = classify(err)
	e.H.Add(op)
	if err == nil {
		e.Note("snapshot-restore", fmt.Sprintf("node %d restored index %d at %d in %.1fs: %d leases kept, %d re-fenced, %d superseded",
			l, info.Index, info.RestoredIndex, float64(op.Return-op.Call)/1e9, info.Kept, info.Refenced, info.Superseded), nil)
		e.Count("restores", 1)
		e.Count("restore-file-leases", len(restored))
		e.Count("restore-kept", info.Kept)
		e.Count("restore-refenced", info.Refenced)
		e.Count("restore-superseded", info.Superseded)
	}
	return op, err
}

// padPrefix starts the keys of the leases padSnapshot adds.
const padPrefix = "pad/"

// padPerHolder is how many of the padding leases one holder has: well
// under the servers' --max-leases-per-holder (100,000 by default), which a
// restore respects too.
const padPerHolder = 50_000

// padSnapshot returns file with n more active leases (keys padPrefix+i,
// padPerHolder each of holders padding-0, padding-1 and so on, an hour's
// TTL, granted in the file's last tick), so that restoring it
// takes many chunks and a state of that size: the restore-lost-leader and
// restore-large scenarios. The workload never touches those keys.
func padSnapshot(file []byte, n int) ([]byte, error) {
	info, body, err := wire.ReadSnapshotFile(bytes.NewReader(file))
	if err != nil {
		return nil, err
	}
	f := fsm.New()
	if err := f.Restore(body); err != nil {
		return nil, err
	}
	index := f.Index()
	for i := 0; i < n; {
		b := &fsm.Batch{}
		for ; i < n && len(b.Commands) < fsm.MaxBatch; i++ {
			id := fmt.Sprintf("ls_pad%07d", i)
			b.Commands = append(b.Commands, &fsm.Acquire{LeaseID: id, Key: fmt.Sprintf("%s%07d", padPrefix, i), Holder: fmt.Sprintf("padding-%d", i/padPerHolder),
				Limit: 1, TTLMS: 3_600_000, TTLTicks: uint64(3_600_000 / max(f.PeriodMS(), 1)), TokenHash: fsm.HashOf(id), WallMS: 1})
		}
		index++
		for _, r := range f.Apply(index, b) {
			if r.Err != nil {
				return nil, fmt.Errorf("pad the snapshot: %v", r.Err)
			}
		}
		f.TakeEvents()
		f.TakeNotices()
	}
	var out bytes.Buffer
	h := sha256.New()
	size, err := f.Snapshot().WriteTo(io.MultiWriter(&out, h))
	if err != nil {
		return nil, err
	}
	info.Index, info.Size, info.SHA256, info.State = index, size, hex.EncodeToString(h.Sum(nil)), nil
	hdr, err := wire.EncodeSnapshotHeader(info)
	if err != nil {
		return nil, err
	}
	return append(hdr, out.Bytes()...), nil
}

// paddedSnapshot saves a snapshot, pads it with pad leases and says what
// it brings back (fileLeases).
func (e *Env) paddedSnapshot(ctx context.Context, pad int) ([]byte, map[string]string, error) {
	file, err := e.saveSnapshot(ctx)
	if err != nil {
		return nil, nil, err
	}
	if file, err = padSnapshot(file, pad); err != nil {
		return nil, nil, err
	}
	restored, err := fileLeases(file)
	return file, restored, err
}

// restoreCutOff saves a snapshot, pads it with pad leases, and restores it
// on the leader while the leader is cut off from the others shortly after
// the restore starts (a random delay of up to 30 ms, while its chunks are
// still being sent on a large enough file). Whatever the restore answers,
// every server must end with the same state (the convergence checker), and
// the checkers judge the history with the restore's outcome as answered.
func (e *Env) restoreCutOff(ctx context.Context, pad int) error {
	file, restored, err := e.paddedSnapshot(ctx, pad)
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, faultFor/2); err != nil {
		return err
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	type answer struct {
		op  Op
		err error
	}
	done := make(chan answer, 1)
	go func() {
		op, err := e.restoreAttempt(ctx, l, file, restored, 60*time.Second)
		done <- answer{op, err}
	}()
	if err := sleepCtx(ctx, time.Duration(e.Rng.IntN(30))*time.Millisecond); err != nil {
		return err
	}
	var a answer
	answered := false
	err = e.Fault(ctx, "partition", fmt.Sprintf("leader %d alone right after a restore started", l), faultFor,
		func() error {
			select {
			case a = <-done:
				answered = true
			default:
			}
			return e.C.Partition([][]int{{l}, e.Others(l)})
		}, e.C.Heal)
	if err != nil {
		if !answered {
			<-done // its operation is in the history before the checkers read it
		}
		return err
	}
	if !answered {
		a = <-done
		e.Count("restores-cut", 1)
	}
	e.Note("snapshot-restore", fmt.Sprintf("node %d, cut off during the restore: %v", l, !answered), a.err)
	return sleepCtx(ctx, faultFor/2)
}

// restoreDuringBacklog binds n leases (keys under padPrefix) to one
// session, saves a snapshot while it is active, lets it expire (its end
// needs more than one expiry chunk, so its leases end over several
// entries), and restores the snapshot the moment the session is seen to
// have ended, while its leases may still be being ended.
func (e *Env) restoreDuringBacklog(ctx context.Context, n int) error {
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	cl := e.admin[l]
	s, err := cl.CreateSession(ctx, wire.SessionRequest{Holder: "backlog", TTLMS: 10_000})
	if err != nil {
		return fmt.Errorf("create the session: %w", err)
	}
	hbCtx, stopHB := context.WithCancel(ctx)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		for hbCtx.Err() == nil {
			cl.SessionHeartbeat(hbCtx, s.SessionID, s.Token)
			sleepCtx(hbCtx, time.Second)
		}
	}()
	var made atomic.Int64
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				for try := 0; try < 10 && ctx.Err() == nil; try++ {
					_, err := cl.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("%sbl/%05d", padPrefix, i), Holder: "backlog",
						SessionID: s.SessionID, SessionToken: s.Token, IdempotencyKey: fmt.Sprintf("bl-%05d", i)})
					if err == nil {
						made.Add(1)
						break
					}
					sleepCtx(ctx, 100*time.Millisecond) // a leader change: again, idempotently
				}
			}
		})
	}
	wg.Wait()
	file, err := e.saveSnapshot(ctx)
	stopHB()
	<-hbDone
	if err != nil {
		return err
	}
	e.Count("backlog-leases", int(made.Load()))
	e.Note("backlog", fmt.Sprintf("session %s holds %d leases; it is left to expire", s.SessionID, made.Load()), nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := cl.GetSession(ctx, s.SessionID)
		if err == nil && got.State != "active" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the session did not expire: %+v %v", got, err)
		}
		if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
			return err
		}
	}
	if err := e.restoreSnapshot(ctx, file); err != nil {
		return err
	}
	return sleepCtx(ctx, faultFor/2)
}
