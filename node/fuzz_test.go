package node

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// FuzzParseEventID: the Last-Event-ID parser (also ?after= of a
// subscription) accepts exactly "<index>" and "<index>-<seq>" in decimal,
// and what it accepts prints back to an id that parses to the same.
func FuzzParseEventID(f *testing.F) {
	for _, s := range []string{"12-3", "12", "0-0", "18446744073709551615-4294967295", "1-4294967296", "-1", "1--2", "+1-2", "1-", "01-002", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok := parseEventID(s)
		is, ss, hasSeq := strings.Cut(s, "-")
		_, ierr := strconv.ParseUint(is, 10, 64)
		_, serr := strconv.ParseUint(ss, 10, 32)
		if want := ierr == nil && (!hasSeq || serr == nil); ok != want {
			t.Fatalf("%q: accepted %v, want %v", s, ok, want)
		}
		if !ok {
			if id != (eventID{}) {
				t.Fatalf("%q: refused, yet id %+v", s, id)
			}
			return
		}
		back, ok := parseEventID(id.String())
		if !ok || back != id {
			t.Fatalf("%q -> %+v -> %q -> %+v (%v)", s, id, id.String(), back, ok)
		}
	})
}

// fuzzSnapshotState is the state body of a small snapshot with leases,
// sessions, a waiter, lock-delay and members.
func fuzzSnapshotState(t testing.TB) []byte {
	m := fsm.New()
	tok := func(s string) fsm.Hash { return fsm.HashOf("t:" + s) }
	for i, c := range []fsm.Command{
		&fsm.Tick{Tick: 1, PeriodMS: 100, RetainTicks: 100},
		&fsm.SessionCreate{SessionID: "ss_1", Holder: "alice", TokenHash: tok("s"), TTLMS: 1000, TTLTicks: 10},
		&fsm.Acquire{LeaseID: "ls_1", Key: "k", Holder: "bob", Limit: 1, TokenHash: tok("1"), TTLMS: 1000, TTLTicks: 10,
			Metadata: map[string]string{"a": "b"}, LockDelayMS: 300, LockDelayTicks: 3},
		&fsm.Acquire{LeaseID: "ls_2", Key: "k", Holder: "carol", Limit: 1, TokenHash: tok("2"), TTLMS: 1000, TTLTicks: 10, WaitTicks: 50},
		&fsm.Acquire{LeaseID: "ls_3", Key: "k2", Limit: 1, SessionID: "ss_1", SessionTokenHash: tok("s"), TokenHash: tok("3")},
		&fsm.Revoke{LeaseID: "ls_1"},
		&fsm.Member{ID: "n1", Incarnation: "i1"},
	} {
		if r := m.Apply(uint64(i+1), c); r[0].Err != nil {
			t.Fatalf("%T: %v", c, r[0].Err)
		}
	}
	var b bytes.Buffer
	if _, err := m.Snapshot().WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// snapshotFile wraps a state body in a snapshot file whose header
// describes it.
func snapshotFile(t testing.TB, body []byte) []byte {
	sum := sha256.Sum256(body)
	hdr, err := encodeSnapshotHeader(&SnapshotInfo{Index: 7, Term: 2, CreatedAt: time.Unix(1700000000, 5).UTC(),
		NodeID: "n1", Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// FuzzSnapshotFile: the snapshot file reader (restore and inspect) on
// arbitrary files, and on arbitrary state bodies inside a file whose header
// is right for them (so the state decoder is reached past the checksum).
// Invariants: every refusal of an in-memory file is an INVALID_ARGUMENT
// *Error; an accepted file's header describes exactly its body, its
// header re-encodes to the same bytes, and the body reader ends with
// io.EOF only after the whole body.
func FuzzSnapshotFile(f *testing.F) {
	state := fuzzSnapshotState(f)
	good := snapshotFile(f, state)
	f.Add(good, false)
	f.Add(state, true)
	f.Add(good[:len(good)-1], false)
	f.Add(append(bytes.Clone(good), 'x'), false)
	f.Add([]byte("LEASEHOLD-SNAPSHOT\n2\n{}\n"), false)
	f.Add([]byte("LEASEHOLD-SNAPSHOT\n1\n{\"size\":-1}\n"), false)
	f.Add([]byte("{}"), true)
	f.Fuzz(func(t *testing.T, b []byte, wrap bool) {
		file := b
		if wrap {
			file = snapshotFile(t, b)
		}
		info, err := InspectSnapshotFile(bytes.NewReader(file))
		if err != nil {
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != wire.CodeInvalidArgument || e.Message == "" {
				t.Fatalf("refusal is not INVALID_ARGUMENT: %#v", err)
			}
			if info != nil {
				t.Fatalf("refused, yet info %+v", info)
			}
			return
		}
		if info.State == nil {
			t.Fatal("accepted without a state summary")
		}
		// Read it again by hand: header, then the body to its end.
		info2, body, err := ReadSnapshotFile(bytes.NewReader(file))
		if err != nil {
			t.Fatalf("inspect accepted what ReadSnapshotFile refuses: %v", err)
		}
		got, err := io.ReadAll(body)
		if err != nil {
			t.Fatalf("body: %v", err)
		}
		sum := sha256.Sum256(got)
		if int64(len(got)) != info2.Size || hex.EncodeToString(sum[:]) != info2.SHA256 || info2.SHA256 != info.SHA256 {
			t.Fatalf("body of %d bytes, header says %d and %s", len(got), info2.Size, info2.SHA256)
		}
		hdr, err := encodeSnapshotHeader(info2)
		if err != nil {
			t.Fatal(err)
		}
		again, _, err := ReadSnapshotFile(bytes.NewReader(append(hdr, got...)))
		if err != nil || again.Index != info2.Index || again.Term != info2.Term || !again.CreatedAt.Equal(info2.CreatedAt) ||
			again.NodeID != info2.NodeID || again.Size != info2.Size || again.SHA256 != info2.SHA256 {
			t.Fatalf("header round trip: %+v -> %+v (%v)", info2, again, err)
		}
	})
}
