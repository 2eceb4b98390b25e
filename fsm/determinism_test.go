package fsm_test

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// replica applies encoded log entries and records, per entry, everything an
// observer outside the state machine sees: results, events, notices.
type replica struct {
	t       testing.TB
	f       *fsm.FSM
	trace   map[uint64]string // index -> rendering of the entry's outcome
	events  []fsm.Event       // of the last entry
	notices []fsm.Notice
}

func newReplica(t testing.TB) *replica {
	return &replica{t: t, f: fsm.New(), trace: map[uint64]string{}}
}

func (r *replica) apply(index uint64, entry []byte) []fsm.Result {
	r.t.Helper()
	c, err := fsm.Decode(entry)
	if err != nil {
		r.t.Fatalf("entry %d: %v", index, err)
	}
	res := r.f.Apply(index, c)
	ev, no := r.f.TakeEvents(), r.f.TakeNotices()
	r.events, r.notices = ev, no
	r.trace[index] = jsonOf(r.t, res) + "\n" + jsonOf(r.t, ev) + "\n" + jsonOf(r.t, no)
	return res
}

// randomLog generates a log with every kind of command (waits, idempotency
// keys, reused ids, stale ticks, batches), feeding the generator what a
// replica granted so that most commands hit live records.
func randomLog(t testing.TB, seed uint64, n int) [][]byte {
	return genLog(t, newGen(seed, true), n)
}

// randomLogMembers is randomLog with Member and MemberKey commands and
// metadata renewals too.
func randomLogMembers(t testing.TB, seed uint64, n int) [][]byte {
	g := newGen(seed, true)
	g.members, g.grantKeys, g.meta, g.groups = true, true, true, true
	return genLog(t, g, n)
}

func genLog(t testing.TB, g *gen, n int) [][]byte {
	r := newReplica(t)
	var log [][]byte
	for i := range n {
		b, err := fsm.Encode(g.entry())
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		log = append(log, b)
		res := r.apply(uint64(i+1), b)
		g.granted(res, r.notices)
	}
	return log
}

func TestDeterminism(t *testing.T) {
	const seeds, entries, every = 6, 1200, 100
	for seed := uint64(1); seed <= seeds; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			log := randomLogMembers(t, seed, entries)
			a, b := newReplica(t), newReplica(t)
			obs := newObserver()
			obs.reuse = true
			snaps := map[uint64][]byte{} // index -> a's snapshot bytes
			for i, e := range log {
				index := uint64(i + 1)
				a.apply(index, e)
				b.apply(index, e)
				c, _ := fsm.Decode(e)
				if err := obs.check(a.f, index, flatten(c), a.events, genRetain); err != nil {
					t.Fatalf("entry %d: invariant: %v", index, err)
				}
				if err := checkKeys(a.f, snapshotBytes(t, a.f)); err != nil {
					t.Fatalf("entry %d: %v", index, err)
				}
				if a.trace[index] != b.trace[index] {
					t.Fatalf("entry %d: replicas disagree:\n%s\n%s", index, a.trace[index], b.trace[index])
				}
				if index%every == 0 || index == uint64(len(log)) {
					sa, sb := snapshotBytes(t, a.f), snapshotBytes(t, b.f)
					if !bytes.Equal(sa, sb) {
						t.Fatalf("entry %d: snapshots differ:\n%s\n%s", index, sa, sb)
					}
					snaps[index] = sa
				}
			}
			if len(a.f.Members()) < 3 {
				t.Fatalf("the log left %d members: the generator hardly made any", len(a.f.Members()))
			}
			// Replicas restored from a snapshot (after holding other state)
			// and fed the rest of the log see and hold the same.
			for _, from := range []uint64{every * 3, entries / 2, every * 9} {
				c := newReplica(t)
				c.apply(1, mustEncode(t, &fsm.Tick{Tick: 1, PeriodMS: 77}))
				c.apply(2, mustEncode(t, acq("stale", "stale-key", "x", 1000)))
				if err := c.f.Restore(bytes.NewReader(snaps[from])); err != nil {
					t.Fatalf("restore at %d: %v", from, err)
				}
				if c.f.Lease("stale") != nil || c.f.ActiveOnKey("stale-key") != nil || c.f.Index() != from || c.f.PeriodMS() != periodMS {
					t.Fatalf("restore kept earlier state: index %d period %d", c.f.Index(), c.f.PeriodMS())
				}
				if got := snapshotBytes(t, c.f); !bytes.Equal(got, snaps[from]) {
					t.Fatalf("snapshot of the restored replica differs from the one it restored:\n%s\n%s", got, snaps[from])
				}
				if ev := c.f.TakeEvents(); len(ev) != 0 {
					t.Fatalf("events survived the restore: %v", ev)
				}
				for i := from; i < uint64(len(log)); i++ {
					index := i + 1
					c.apply(index, log[i])
					if c.trace[index] != a.trace[index] {
						t.Fatalf("restored at %d, entry %d differs:\n%s\n%s", from, index, c.trace[index], a.trace[index])
					}
					if want, ok := snaps[index]; ok {
						if got := snapshotBytes(t, c.f); !bytes.Equal(got, want) {
							t.Fatalf("restored at %d, snapshot at %d differs:\n%s\n%s", from, index, got, want)
						}
					}
				}
			}
		})
	}
}

// checkKeys reads the per-key state out of a snapshot and checks what the
// API does not show: no waiter is left queued while its key has a free slot,
// nothing is overdue, and no key state outlives every reason to keep it.
func checkKeys(f *fsm.FSM, snap []byte) error {
	keys, err := fsm.SnapshotKeys(snap)
	if err != nil {
		return err
	}
	for _, k := range keys {
		active := len(f.ActiveOnKey(k.Key))
		// A lease group at the head of a key's queue keeps its free slots
		// while it waits for its other keys (group.go).
		if len(k.Waiters) > 0 && active+len(k.Blocked) < int(k.Limit) && !f.GroupHeldUp(k.Key) {
			return fmt.Errorf("key %s: %d waiters queued with %d active, %d blocked of %d", k.Key, len(k.Waiters), active, len(k.Blocked), k.Limit)
		}
		for _, b := range k.Blocked {
			if b.Until <= f.Tick() {
				return fmt.Errorf("key %s: lock-delay until %d still on at tick %d", k.Key, b.Until, f.Tick())
			}
		}
		for _, w := range k.Waiters {
			if w.Deadline <= f.Tick() {
				return fmt.Errorf("key %s: waiter past its deadline %d at tick %d", k.Key, w.Deadline, f.Tick())
			}
		}
		for _, id := range k.Stolen {
			if l := f.Lease(id); l == nil || l.Key != k.Key || !l.Terminal() {
				return fmt.Errorf("key %s: stolen lease %s is %+v", k.Key, id, l)
			}
		}
		if active == 0 && len(k.Blocked) == 0 && len(k.Waiters) == 0 && len(k.Stolen) == 0 {
			return fmt.Errorf("key %s: state kept for nothing", k.Key)
		}
	}
	return nil
}

func mustEncode(t testing.TB, c fsm.Command) []byte {
	t.Helper()
	b, err := fsm.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSnapshotWhileApplying encodes a snapshot while the state machine goes
// on applying (the race detector checks the copy-on-write promise).
func TestSnapshotWhileApplying(t *testing.T) {
	log := randomLogMembers(t, 42, 800)
	r := newReplica(t)
	for i, e := range log[:400] {
		r.apply(uint64(i+1), e)
	}
	s1, s2 := r.f.Snapshot(), r.f.Snapshot()
	var want bytes.Buffer
	if _, err := s1.WriteTo(&want); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s2.WriteTo(&got); err != nil {
			t.Error(err)
		}
	})
	for i, e := range log[400:] {
		r.apply(uint64(400+i+1), e)
	}
	wg.Wait()
	if !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("snapshot changed while the state machine applied entries")
	}
	if s2.Index() != 400 {
		t.Fatalf("snapshot index %d, want 400", s2.Index())
	}
}

func TestRestoreRejects(t *testing.T) {
	r := newReplica(t)
	for i, e := range randomLog(t, 7, 300) {
		r.apply(uint64(i+1), e)
	}
	good := snapshotBytes(t, r.f)
	recs, err := fsm.SplitSnapshot(good)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := fsm.SnapshotKeys(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 2 || len(recs) < len(keys)+3 {
		t.Fatalf("the log left %d keys and %d records: too few to corrupt", len(keys), len(recs))
	}
	allLeases, _ := r.f.Leases(fsm.LeaseFilter{})
	allSessions, _ := r.f.Sessions("", "", 0)
	nLeases, nSessions := len(allLeases), len(allSessions)
	if len(recs) != 1+len(keys)+nSessions+nLeases || nLeases < 2 {
		t.Fatalf("%d records for %d keys, %d sessions, %d leases", len(recs), len(keys), nSessions, nLeases)
	}
	header := func(format uint64, k, s, l int) []byte {
		return fsm.EncodeHeaderRecord(format, r.f.Index(), r.f.Tick(), k, s, l)
	}
	with := func(i int, rec []byte) string {
		c := slices.Clone(recs)
		c[i] = rec
		return string(fsm.JoinSnapshot(c))
	}
	swapped := func(i, j int) string {
		c := slices.Clone(recs)
		c[i], c[j] = c[j], c[i]
		return string(fsm.JoinSnapshot(c))
	}
	lastLease := len(recs) - 1
	active := &fsm.Lease{ID: "L", Key: "k", Holder: "h", Limit: 1, State: fsm.StateActive, Fence: 2,
		TokenHash: tok("L"), TTLMS: 1000, TTLTicks: 1, ExpiresTick: 2, AcquiredTick: 1}
	overLimit := *active
	overLimit.Limit = fsm.MaxLimit + 1
	badState := fsm.EncodeLeaseRecord(active)
	badState[2+2+2+1+1] = 9 // after the id, key, holder, limit and session
	idem := fsm.EncodeLeaseRecord(active)
	idem = append(idem[:len(idem)-2], 1)                                // the flag, set
	idem = append(idem, make([]byte, 64)...)                            // two zero hashes
	idem = append(idem, 0)                                              // no sealed token
	longLength := append([]byte(fsm.SnapMagic), 0x80, 0x80, 0x80, 0x02) // a record of 4 MiB, not there
	shortest := append([]byte(fsm.SnapMagic), byte(len(recs[0])|0x80), 0)
	shortest = append(shortest, good[len(fsm.SnapMagic)+1:]...)

	good1 := snapshotV1(t, r.f)
	lines := strings.SplitAfter(string(good1), "\n")
	header1 := lines[0]
	tests := []struct{ name, data string }{
		{"empty", ""},
		{"magic only", fsm.SnapMagic},
		{"bad magic", "LHSNAQ" + string(good[len(fsm.SnapMagic):])},
		{"unknown format", with(0, header(3, len(keys), nSessions, nLeases))},
		{"truncated", string(good[:len(good)/2])},
		{"truncated record", string(good[:len(good)-1])},
		{"trailing data", string(good) + "\x00"},
		{"trailing record", string(fsm.JoinSnapshot(append(slices.Clone(recs), recs[lastLease])))},
		{"more leases than records", with(0, header(fsm.SnapshotFormat, len(keys), nSessions, nLeases+1))},
		{"fewer leases than records", with(0, header(fsm.SnapshotFormat, len(keys), nSessions, nLeases-1))},
		{"trailing bytes in a record", with(lastLease, append(slices.Clone(recs[lastLease]), 0))},
		{"leases out of order", swapped(lastLease, lastLease-1)},
		{"keys out of order", swapped(1, 2)},
		{"length not in shortest form", string(shortest)},
		{"record longer than the input", string(longLength)},
		{"unknown lease state", string(fsm.JoinSnapshot([][]byte{header(fsm.SnapshotFormat, 1, 0, 1),
			fsm.EncodeKeyRecord(fsm.SnapKey{Key: "k", Limit: 1}), badState}))},
		{"idempotency flag without hashes", string(fsm.JoinSnapshot([][]byte{header(fsm.SnapshotFormat, 1, 0, 1),
			fsm.EncodeKeyRecord(fsm.SnapKey{Key: "k", Limit: 1}), idem}))},
		{"active lease without key state", string(fsm.JoinSnapshot([][]byte{header(fsm.SnapshotFormat, 0, 0, 1),
			fsm.EncodeLeaseRecord(active)}))},
		{"lease limit above MaxLimit", string(fsm.JoinSnapshot([][]byte{header(fsm.SnapshotFormat, 1, 0, 1),
			fsm.EncodeKeyRecord(fsm.SnapKey{Key: "k", Limit: fsm.MaxLimit + 1}), fsm.EncodeLeaseRecord(&overLimit)}))},

		// Format 1.
		{"v1 not json", "{hello\n"},
		{"v1 unknown format", strings.Replace(header1, `"leasehold_snapshot":1`, `"leasehold_snapshot":3`, 1)},
		{"v1 unknown header field", strings.Replace(header1, `{`, `{"extra":1,`, 1)},
		{"v1 truncated", strings.Join(lines[:len(lines)/2], "")},
		{"v1 trailing data", string(good1) + "{}\n"},
		{"v1 more leases than records", strings.Replace(header1, `"leases":`, `"leases":1`, 1) + strings.Join(lines[1:], "")},
		{"v1 active lease without key state", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":1,"sessions":0,"keys":0}
{"id":"L","key":"k","holder":"h","limit":1,"state":"active","fence":2,"token_hash":"` + strings.Repeat("ab", 32) + `","acquired_tick":1,"acquired_wall_ms":0}
`},
		{"v1 unknown state", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":1,"sessions":0,"keys":0}
{"id":"L","key":"k","holder":"h","limit":1,"state":"bogus","fence":2,"token_hash":"` + strings.Repeat("ab", 32) + `","acquired_tick":1,"acquired_wall_ms":0}
`},
		{"v1 duplicate lease", strings.Replace(header1, fmt.Sprintf(`"leases":%d`, nLeases), fmt.Sprintf(`"leases":%d`, nLeases+1), 1) +
			lines[1] + strings.Join(lines[1:], "")},
		{"v1 waiter without a command", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":0,"sessions":0,"keys":1}
{"key":"k","limit":1,"waiters":[{"deadline":5}]}
`},
		{"v1 waiter with a null command", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":0,"sessions":0,"keys":1}
{"key":"k","limit":1,"waiters":[{"cmd":null,"deadline":5}]}
`},
		{"v1 lease limit above MaxLimit", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":1,"sessions":0,"keys":1}
{"id":"L","key":"k","holder":"h","limit":10001,"state":"active","fence":2,"token_hash":"` + strings.Repeat("ab", 32) + `","acquired_tick":1,"acquired_wall_ms":0}
{"key":"k","limit":10001}
`},
		{"v1 waiter limit above MaxLimit", `{"leasehold_snapshot":1,"index":3,"tick":1,"period_ms":1000,"wall_ms":0,"fence":2,"leases":0,"sessions":0,"keys":1}
{"key":"k","limit":70000,"waiters":[{"cmd":{"lease_id":"W","key":"k","holder":"h","limit":70000,"token_hash":"` + strings.Repeat("ab", 32) + `"},"deadline":5}]}
`},
		{"v1 bad hash", strings.Replace(string(good1), `"token_hash":"`, `"token_hash":"zz`, 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.data == string(good) || tt.data == string(good1) {
				t.Fatal("the corruption did not change the snapshot")
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := r.f.Restore(strings.NewReader(tt.data))
			if err == nil {
				t.Fatal("Restore accepted a bad snapshot")
			}
			t.Log(err)
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
				t.Errorf("a failed Restore of %d bytes allocated %d bytes", len(tt.data), n)
			}
			if got := snapshotBytes(t, r.f); !bytes.Equal(got, good) {
				t.Fatal("a failed Restore changed the state")
			}
		})
	}
	// The good snapshots still restore, into a fresh machine too, and the
	// format 1 one to the same state.
	for _, snap := range [][]byte{good, good1} {
		f := fsm.New()
		if err := f.Restore(bytes.NewReader(snap)); err != nil {
			t.Fatal(err)
		}
		if got := snapshotBytes(t, f); !bytes.Equal(got, good) {
			t.Fatal("restored state differs")
		}
	}
}

// snapshotV1 encodes the state of f in format 1.
func snapshotV1(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := fsm.WriteSnapshotV1(f.Snapshot(), &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestRestoreFormat1 restores a format 1 snapshot written by the code before
// format 2 (testdata/snapshot_v1.json: the state after entry 58 of
// randomLog(2), with waiters, lock-delays, stolen slots, sessions and
// idempotent leases) to the state that replaying the log gives.
func TestRestoreFormat1(t *testing.T) {
	old, err := os.ReadFile("testdata/snapshot_v1.json")
	if err != nil {
		t.Fatal(err)
	}
	r := newReplica(t)
	for i, e := range randomLog(t, 2, 58) {
		r.apply(uint64(i+1), e)
	}
	want := snapshotBytes(t, r.f)
	if got := snapshotBytes(t, restored(t, old)); !bytes.Equal(got, want) {
		t.Fatal("the format 1 snapshot restores to another state than replaying the log gives")
	}
	if got := snapshotV1(t, r.f); len(got) != len(old) {
		t.Fatalf("format 1 rendering of the state is %d bytes, the snapshot %d", len(got), len(old))
	}
}
