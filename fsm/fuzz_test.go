package fsm_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// sampleCommands returns one valid command of every type, and a batch.
func sampleCommands() []fsm.Command {
	a := withIdem(withWait(withDelay(acq("L1", "k", "alice", 5), 2), 3), "op", "fp")
	a.Metadata = map[string]string{"owner": "alice", "ünï": "cödé"}
	a.SealedToken = []byte{0, 1, 2, 250}
	cmds := []fsm.Command{
		&fsm.Tick{Tick: 1, WallMS: 1700000000000, PeriodMS: periodMS, RetainTicks: 3600},
		a,
		bound("L2", "k2", "S1"),
		&fsm.Renew{LeaseID: "L1", TokenHash: tok("L1"), TTLMS: 9000, TTLTicks: 9, WallMS: 5},
		&fsm.Release{LeaseID: "L2", SessionTokenHash: tok("S1"), Reason: "done", WallMS: 6},
		&fsm.Revoke{LeaseID: "L1", Reason: "op", WallMS: 7},
		&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "L1", TokenHash: tok("L1")}}, WallMS: 8},
		session("S1", "alice", 10),
		&fsm.SessionHeartbeat{SessionID: "S1", TokenHash: tok("S1"), WallMS: 9},
		&fsm.SessionEnd{SessionID: "S1", Force: true, WallMS: 10},
		&fsm.ReleaseHolder{Holder: "alice", Reason: "restart", WallMS: 11},
		&fsm.CancelWait{LeaseID: "L1", Key: "k"},
		&fsm.Member{ID: "n1", Incarnation: "3f2a9c", Removed: true},
	}
	batch := &fsm.Batch{Commands: append([]fsm.Command(nil), cmds...)}
	return append(cmds, batch)
}

// normalize makes the empty maps and slices of a decoded command nil, as
// they are after a round trip (Decode returns nil for empty). Decode already
// does this; normalize checks nothing else is needed.
func normalize(c fsm.Command) {
	switch c := c.(type) {
	case *fsm.Acquire:
		if len(c.Metadata) == 0 {
			c.Metadata = nil
		}
		if len(c.SealedToken) == 0 {
			c.SealedToken = nil
		}
	case *fsm.SessionCreate:
		if len(c.Metadata) == 0 {
			c.Metadata = nil
		}
	case *fsm.AcquireGroup:
		if len(c.Metadata) == 0 {
			c.Metadata = nil
		}
		if len(c.SealedToken) == 0 {
			c.SealedToken = nil
		}
	case *fsm.Batch:
		for _, sub := range c.Commands {
			normalize(sub)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	for _, c := range sampleCommands() {
		b, err := fsm.Encode(c)
		if err != nil {
			t.Fatalf("encode %T: %v", c, err)
		}
		if b[0] != fsm.Version || fsm.Type(b[1]) != c.Type() {
			t.Fatalf("%T: header % x", c, b[:2])
		}
		d, err := fsm.Decode(b)
		if err != nil {
			t.Fatalf("decode %T: %v", c, err)
		}
		if !reflect.DeepEqual(d, c) {
			t.Fatalf("round trip of %T:\n got %#v\nwant %#v", c, d, c)
		}
	}
	v1 := byte(versionJSON)
	bad := map[string][]byte{
		"empty":          {},
		"header only":    {fsm.Version},
		"version 0":      {0, byte(fsm.TypeTick), 1, 0, 0, 0},
		"version 4":      {4, byte(fsm.TypeTick), 1, 0, 0, 0},
		"type 0":         {fsm.Version, 0, 1, 0, 0, 0},
		"type 14":        {fsm.Version, 14, 1, 0, 0, 0},
		"no body":        {fsm.Version, byte(fsm.TypeTick)},
		"short body":     {fsm.Version, byte(fsm.TypeTick), 1, 0, 0, 0},
		"trailing byte":  {fsm.Version, byte(fsm.TypeTick), 1, 0, 0, 0, 0, 0},
		"empty batch":    {fsm.Version, byte(fsm.TypeBatch)},
		"batch framing":  {fsm.Version, byte(fsm.TypeBatch), 10, byte(fsm.TypeTick)},
		"nested batch":   {fsm.Version, byte(fsm.TypeBatch), 1, byte(fsm.TypeBatch), 1, byte(fsm.TypeTick), 1, 0, 0, 0, 0},
		"bad sub entry":  {fsm.Version, byte(fsm.TypeBatch), 1, 99},
		"overlong count": {fsm.Version, byte(fsm.TypeBatch), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},

		// Version 1: JSON bodies.
		"v1 type 14":        {v1, 14, '{', '}'},
		"v1 no body":        {v1, byte(fsm.TypeTick)},
		"v1 unknown field":  append([]byte{v1, byte(fsm.TypeTick)}, `{"tick":1,"extra":2}`...),
		"v1 trailing data":  append([]byte{v1, byte(fsm.TypeTick)}, `{"tick":1}{}`...),
		"v1 wrong type":     append([]byte{v1, byte(fsm.TypeTick)}, `{"tick":"1"}`...),
		"v1 short hash":     append([]byte{v1, byte(fsm.TypeRenew)}, `{"lease_id":"x","token_hash":"abcd"}`...),
		"v1 empty batch":    {v1, byte(fsm.TypeBatch)},
		"v1 batch framing":  {v1, byte(fsm.TypeBatch), 10, v1},
		"v1 nested batch":   {v1, byte(fsm.TypeBatch), 4, v1, byte(fsm.TypeBatch), 1, 0},
		"v1 bad sub entry":  {v1, byte(fsm.TypeBatch), 2, v1, 99},
		"v1 overlong count": {v1, byte(fsm.TypeBatch), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	}
	for name, b := range bad {
		if c, err := fsm.Decode(b); err == nil {
			t.Errorf("%s: Decode accepted % x as %#v", name, b, c)
		}
	}
	if _, err := fsm.Encode(&fsm.Batch{}); err == nil {
		t.Error("Encode accepted an empty batch")
	}
	if _, err := fsm.Encode(&fsm.Batch{Commands: []fsm.Command{&fsm.Batch{Commands: []fsm.Command{&fsm.Tick{}}}}}); err == nil {
		t.Error("Encode accepted a nested batch")
	}
	big := &fsm.Batch{}
	for range fsm.MaxBatch + 1 {
		big.Commands = append(big.Commands, &fsm.CancelWait{LeaseID: "x", Key: "k"})
	}
	if _, err := fsm.Encode(big); err == nil {
		t.Error("Encode accepted an oversized batch")
	}
	// Decode refuses what Encode refuses, framed by hand: a count, then
	// (type, body) pairs; in version 1, length-prefixed entries.
	one := mustEncode(t, &fsm.CancelWait{LeaseID: "x", Key: "k"})
	raw := binary.AppendUvarint([]byte{fsm.Version, byte(fsm.TypeBatch)}, fsm.MaxBatch+1)
	for range fsm.MaxBatch + 1 {
		raw = append(raw, one[1:]...)
	}
	if _, err := fsm.Decode(raw); err == nil {
		t.Error("Decode accepted an oversized batch")
	}
	raw = binary.AppendUvarint([]byte{fsm.Version, byte(fsm.TypeBatch)}, fsm.MaxBatch)
	for range fsm.MaxBatch {
		raw = append(raw, one[1:]...)
	}
	if c, err := fsm.Decode(raw); err != nil || len(c.(*fsm.Batch).Commands) != fsm.MaxBatch {
		t.Errorf("Decode refused a batch of MaxBatch: %v", err)
	}
	oneV1 := encodeV1(t, &fsm.CancelWait{LeaseID: "x", Key: "k"})
	raw = []byte{versionJSON, byte(fsm.TypeBatch)}
	for range fsm.MaxBatch + 1 {
		raw = append(raw, byte(len(oneV1)))
		raw = append(raw, oneV1...)
	}
	if _, err := fsm.Decode(raw); err == nil {
		t.Error("Decode accepted an oversized version-1 batch")
	}
}

// fuzzState is a small populated state machine for the fuzz targets.
var fuzzState = sync.OnceValue(func() []byte {
	f := fsm.New()
	for i, c := range []fsm.Command{
		&fsm.Tick{Tick: 1, PeriodMS: periodMS, RetainTicks: 100},
		session("S1", "alice", 10),
		acq("A", "k", "bob", 10),
		withWait(acq("W", "k", "carol", 10), 5),
		withDelay(acq("D", "k2", "dave", 10), 3),
		&fsm.Revoke{LeaseID: "D"},
		bound("B", "k3", "S1"),
		release("B"),
		&fsm.Member{ID: "n1", Incarnation: "i1"},
		&fsm.Member{ID: "n2", Incarnation: "i2", Removed: true},
		&fsm.MemberKey{ID: "n1", Key: fsm.GrantKey{1, 31: 1}},
		&fsm.MemberKey{ID: "n1", Key: fsm.GrantKey{2, 31: 2}},
		grp("G", "erin", 10, "g1", "g2"),
		grpWait(grp("Q", "fay", 10, "g3", "k"), 5),
	} {
		if r := f.Apply(uint64(i+1), c); r[0].Err != nil {
			panic(r[0].Err)
		}
	}
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		panic(err)
	}
	return buf.Bytes()
})

func restored(t testing.TB, snap []byte) *fsm.FSM {
	t.Helper()
	f := fsm.New()
	if err := f.Restore(bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	return f
}

// FuzzDecode: Decode never panics; whatever it accepts re-encodes to a
// command that decodes the same (a current-version input re-encodes to
// exactly itself), applying it never panics either, and a command refused
// with an error changes nothing.
func FuzzDecode(f *testing.F) {
	for _, c := range sampleCommands() {
		b, err := fsm.Encode(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(encodeV1(f, c))
	}
	for _, g := range goldenCommands() {
		b, err := fsm.Encode(g.c) // some carry a Quota
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		if v2, err := hex.DecodeString(g.hex); err == nil {
			f.Add(v2)
		}
	}
	for _, c := range append(metaCommands(), groupCommands()...) {
		b, err := fsm.Encode(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{fsm.Version, byte(fsm.TypeBatch), 0})
	f.Add(append([]byte{versionJSON, byte(fsm.TypeAcquire)}, `{"metadata":{},"sealed_token":"","token_hash":null}`...))
	f.Add(append([]byte{versionJSON, byte(fsm.TypeHeartbeat)}, `{"items":[],"wall_ms":1}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := fsm.Decode(b)
		if err != nil {
			if c != nil {
				t.Fatalf("Decode returned %#v with error %v", c, err)
			}
			return
		}
		e1, err := fsm.Encode(c)
		if err != nil {
			t.Fatalf("Encode refused what Decode accepted (%#v): %v", c, err)
		}
		c2, err := fsm.Decode(e1)
		if err != nil {
			t.Fatalf("Decode refused its own encoding %q: %v", e1, err)
		}
		normalize(c)
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("round trip changed the command:\n got %#v\nwant %#v", c2, c)
		}
		if e2 := mustEncode(t, c2); !bytes.Equal(e1, e2) {
			t.Fatalf("encoding is not stable:\n%q\n%q", e1, e2)
		}
		if b[0] == fsm.Version && !bytes.Equal(b, e1) {
			t.Fatalf("a second encoding of %#v:\n%q\n%q", c, b, e1)
		}

		// A decoded command is a business request: applying it returns
		// results and never panics, and the state still snapshots and
		// restores to the same bytes.
		m := restored(t, fuzzState())
		before := snapshotBytes(t, m)
		res := m.Apply(m.Index()+1, c2)
		if want := len(flatten(c2)); len(res) != want {
			t.Fatalf("%d results for %d commands", len(res), want)
		}
		// A refused command changed nothing: no event, and every record
		// of the state but the header (the index moved) is as it was.
		if _, batch := c2.(*fsm.Batch); !batch && res[0].Err != nil {
			if evs := m.TakeEvents(); len(evs) != 0 {
				t.Fatalf("refused %#v (%v) emitted %v", c2, res[0].Err, evs)
			}
			b, err1 := fsm.SplitSnapshot(before)
			a, err2 := fsm.SplitSnapshot(snapshotBytes(t, m))
			if err1 != nil || err2 != nil || len(a) != len(b) {
				t.Fatalf("refused %#v (%v): %d records, were %d", c2, res[0].Err, len(a), len(b))
			}
			for i := 1; i < len(a); i++ {
				if !bytes.Equal(a[i], b[i]) {
					t.Fatalf("refused %#v (%v) changed record %d:\n%q\n%q", c2, res[0].Err, i, b[i], a[i])
				}
			}
		}
		snap := snapshotBytes(t, m)
		if got := snapshotBytes(t, restored(t, snap)); !bytes.Equal(got, snap) {
			t.Fatalf("snapshot after applying %q does not restore to itself", b)
		}
	})
}

// FuzzRestore: Restore never panics; on error it changes nothing, and what
// it accepts snapshots and restores to the same bytes.
func FuzzRestore(f *testing.F) {
	good := fuzzState()
	f.Add(good)
	f.Add(snapshotBytes(f, fsm.New()))
	f.Add(good[:len(good)/2])
	good1 := snapshotV1(f, restored(f, good))
	f.Add(good1)
	f.Add([]byte(strings.Replace(string(good1), `"cmd":{`, `"cmd":null,"x":{`, 1)))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m := restored(t, good)
		before := snapshotBytes(t, m)
		if err := m.Restore(bytes.NewReader(b)); err != nil {
			if after := snapshotBytes(t, m); !bytes.Equal(after, before) {
				t.Fatalf("failed Restore (%v) changed the state", err)
			}
			return
		}
		snap := snapshotBytes(t, m)
		if got := snapshotBytes(t, restored(t, snap)); !bytes.Equal(got, snap) {
			t.Fatalf("accepted snapshot does not round trip:\n%s\n%s", snap, got)
		}
	})
}
