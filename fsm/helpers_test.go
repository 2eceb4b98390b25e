package fsm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// periodMS is the tick period every test cluster runs at.
const periodMS = 1000

// harness applies commands the way a replica does: encode, decode, apply at
// the next index. It keeps the events and notices of the last entry and of
// the whole run.
type harness struct {
	t         testing.TB
	f         *fsm.FSM
	index     uint64
	retain    uint64 // RetainTicks carried by every tick
	retainMax uint64 // RetainMax carried by every tick

	events     []fsm.Event // of the last entry
	notices    []fsm.Notice
	allEvents  []fsm.Event
	allNotices []fsm.Notice
}

func newHarness(t testing.TB) *harness {
	return &harness{t: t, f: fsm.New()}
}

// roundTrip encodes and decodes c, failing the test if either step fails.
func roundTrip(t testing.TB, c fsm.Command) fsm.Command {
	t.Helper()
	b, err := fsm.Encode(c)
	if err != nil {
		t.Fatalf("encode %T: %v", c, err)
	}
	d, err := fsm.Decode(b)
	if err != nil {
		t.Fatalf("decode %T: %v", c, err)
	}
	return d
}

// apply applies c as the next log entry and returns its results.
func (h *harness) apply(c fsm.Command) []fsm.Result {
	h.t.Helper()
	d := roundTrip(h.t, c)
	h.index++
	res := h.f.Apply(h.index, d)
	h.events = h.f.TakeEvents()
	h.notices = h.f.TakeNotices()
	h.allEvents = append(h.allEvents, h.events...)
	h.allNotices = append(h.allNotices, h.notices...)
	return res
}

// one applies a single non-batch command and returns its result.
func (h *harness) one(c fsm.Command) fsm.Result {
	h.t.Helper()
	res := h.apply(c)
	if len(res) != 1 {
		h.t.Fatalf("%T: %d results, want 1", c, len(res))
	}
	return res[0]
}

// tick advances the clock by n ticks, each its own entry.
func (h *harness) tick(n int) {
	h.t.Helper()
	for range n {
		next := h.f.Tick() + 1
		h.one(&fsm.Tick{Tick: next, WallMS: int64(next) * periodMS, PeriodMS: periodMS, RetainTicks: h.retain, RetainMax: h.retainMax})
	}
}

// tickTo advances the clock to tick t.
func (h *harness) tickTo(t uint64) {
	h.t.Helper()
	if t < h.f.Tick() {
		h.t.Fatalf("tickTo %d: already at %d", t, h.f.Tick())
	}
	h.tick(int(t - h.f.Tick()))
}

// eventsOf returns the events of the last entry with type typ.
func (h *harness) eventsOf(typ fsm.EventType) []fsm.Event {
	var out []fsm.Event
	for _, e := range h.events {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// tok is the token hash of lease or session id in these tests.
func tok(id string) fsm.Hash { return fsm.HashOf("token:" + id) }

var badTok = fsm.HashOf("not the token")

// acq builds a standalone exclusive acquire with a ttl in ticks.
func acq(id, key, holder string, ttl uint64) *fsm.Acquire {
	return &fsm.Acquire{LeaseID: id, Key: key, Holder: holder, Limit: 1, TokenHash: tok(id),
		TTLMS: int64(ttl) * periodMS, TTLTicks: ttl, WallMS: 1}
}

// bound builds an acquire bound to session sid.
func bound(id, key, sid string) *fsm.Acquire {
	return &fsm.Acquire{LeaseID: id, Key: key, Limit: 1, SessionID: sid, SessionTokenHash: tok(sid),
		TokenHash: tok(id), WallMS: 1}
}

func withLimit(a *fsm.Acquire, n uint32) *fsm.Acquire { a.Limit = n; return a }
func withWait(a *fsm.Acquire, n uint64) *fsm.Acquire  { a.WaitTicks = n; return a }
func withDelay(a *fsm.Acquire, n uint64) *fsm.Acquire {
	a.LockDelayTicks, a.LockDelayMS = n, int64(n)*periodMS
	return a
}
func withIdem(a *fsm.Acquire, idem, fp string) *fsm.Acquire {
	a.IdemHash, a.Fingerprint = fsm.HashOf("idem:"+idem), fsm.HashOf("fp:"+fp)
	return a
}

func renew(id string) *fsm.Renew { return &fsm.Renew{LeaseID: id, TokenHash: tok(id), WallMS: 2} }

func release(id string) *fsm.Release { return &fsm.Release{LeaseID: id, TokenHash: tok(id), WallMS: 3} }

func session(id, holder string, ttl uint64) *fsm.SessionCreate {
	return &fsm.SessionCreate{SessionID: id, Holder: holder, TokenHash: tok(id),
		TTLMS: int64(ttl) * periodMS, TTLTicks: ttl, WallMS: 4}
}

// code is the error code of err, "" for none.
func code(err *wire.Error) wire.Code {
	if err == nil {
		return ""
	}
	return err.Code
}

func wantCode(t testing.TB, what string, err *wire.Error, want wire.Code) {
	t.Helper()
	if got := code(err); got != want {
		t.Fatalf("%s: code %q (%v), want %q", what, got, err, want)
	}
	if err != nil && !errors.Is(err, &wire.Error{Code: want}) {
		t.Fatalf("%s: errors.Is does not match code %s", what, want)
	}
}

// snapshotBytes encodes the current state of f.
func snapshotBytes(t testing.TB, f *fsm.FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := f.Snapshot().WriteTo(&buf); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return buf.Bytes()
}

// jsonOf renders v for comparisons that should not care about nil versus
// empty maps and slices.
func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return string(b)
}
