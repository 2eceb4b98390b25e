package fsm_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

func sessionBeat(id string, m map[string]string, set bool) *fsm.SessionHeartbeat {
	return &fsm.SessionHeartbeat{SessionID: id, TokenHash: tok(id), WallMS: 9, Metadata: m, SetMetadata: set}
}

// TestSessionHeartbeatMetadata: a session heartbeat that carries metadata
// replaces the session's metadata with the heartbeat (and the
// session_heartbeat event shows it); without it the metadata stays; empty
// clears it; metadata past its limits, or a heartbeat that fails, changes
// nothing.
func TestSessionHeartbeatMetadata(t *testing.T) {
	h := newHarness(t)
	h.tick(1)
	s := session("S1", "w1", 10)
	s.Metadata = map[string]string{"role": "worker"}
	wantCode(t, "create", h.one(s).Err, "")

	want := map[string]string{"frames": "120", "shards": "3"}
	res := h.one(sessionBeat("S1", want, true))
	wantCode(t, "heartbeat with metadata", res.Err, "")
	if got := h.f.Session("S1").Metadata; !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata after heartbeat: %v, want %v (replaced, not merged)", got, want)
	}
	if res.Session.HeartbeatCount != 1 || !reflect.DeepEqual(res.Session.Metadata, want) {
		t.Fatalf("result session: %+v", res.Session)
	}
	if ev := h.eventsOf(fsm.EventSessionHeartbeat); len(ev) != 1 || !reflect.DeepEqual(ev[0].Session.Metadata, want) {
		t.Fatalf("session_heartbeat events: %+v", ev)
	}

	wantCode(t, "plain heartbeat", h.one(sessionBeat("S1", nil, false)).Err, "")
	if got := h.f.Session("S1").Metadata; !reflect.DeepEqual(got, want) {
		t.Fatalf("a heartbeat without metadata changed it: %v", got)
	}

	for name, m := range tooLarge() {
		before := jsonOf(t, h.f.Session("S1"))
		res := h.one(sessionBeat("S1", m, true))
		wantCode(t, name, res.Err, wire.CodeInvalidArgument)
		if res.Err.Field != "metadata" {
			t.Fatalf("%s: field %q, want metadata", name, res.Err.Field)
		}
		if len(h.events) != 0 {
			t.Fatalf("%s: events %v", name, h.events)
		}
		if after := jsonOf(t, h.f.Session("S1")); after != before {
			t.Fatalf("%s: refused heartbeat changed the session:\n%s\n%s", name, before, after)
		}
	}

	bad := sessionBeat("S1", map[string]string{"x": "y"}, true)
	bad.TokenHash = tok("other")
	wantCode(t, "wrong token", h.one(bad).Err, wire.CodeLeaseTokenInvalid)
	if got := h.f.Session("S1").Metadata; !reflect.DeepEqual(got, want) {
		t.Fatalf("a refused heartbeat changed the metadata: %v", got)
	}

	// The session does not keep the command's map.
	m := map[string]string{"frames": "1"}
	wantCode(t, "heartbeat", h.one(sessionBeat("S1", m, true)).Err, "")
	m["frames"] = "changed"
	if got := h.f.Session("S1").Metadata["frames"]; got != "1" {
		t.Fatalf("the session shares the command's map: %q", got)
	}

	wantCode(t, "clear", h.one(sessionBeat("S1", map[string]string{}, true)).Err, "")
	if got := h.f.Session("S1").Metadata; got != nil {
		t.Fatalf("empty metadata did not clear it: %v", got)
	}
}

// TestSessionHeartbeatMetaCodec: the command has a type of its own (26),
// round-trips exactly, is unknown to entries of earlier versions, and its
// metadata is never written without the flag.
func TestSessionHeartbeatMetaCodec(t *testing.T) {
	plain := sessionBeat("S", nil, false)
	if plain.Type() != fsm.TypeSessionHeartbeat {
		t.Fatalf("plain heartbeat type %d", plain.Type())
	}
	for _, c := range []*fsm.SessionHeartbeat{
		sessionBeat("S", map[string]string{"b": "2", "a": "1", "ünï": "cödé"}, true),
		sessionBeat("S", nil, true),
	} {
		if c.Type() != fsm.TypeSessionHeartbeatMeta || fsm.TypeSessionHeartbeatMeta != 26 {
			t.Fatalf("type %d", c.Type())
		}
		b, err := fsm.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if b[1] != 26 {
			t.Fatalf("type byte %d", b[1])
		}
		d, err := fsm.Decode(b)
		if err != nil || !reflect.DeepEqual(d, c) {
			t.Fatalf("% x decodes as %+v, %v; want %+v", b, d, err, c)
		}
		cb, err := fsm.EncodeChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := fsm.Decode(cb); err != nil || !reflect.DeepEqual(d, c) {
			t.Fatalf("checked % x decodes as %+v, %v", cb, d, err)
		}
		for _, v := range []byte{2, 3} {
			old := append([]byte{v}, b[1:]...)
			if d, err := fsm.Decode(old); err == nil {
				t.Errorf("version %d % x decoded as %+v", v, old, d)
			}
		}
		// Trailing bytes, or the map cut off, are refused.
		if d, err := fsm.Decode(append(append([]byte{}, b...), 0)); err == nil {
			t.Errorf("trailing byte decoded as %+v", d)
		}
		if d, err := fsm.Decode(b[:len(b)-1]); err == nil {
			t.Errorf("short entry decoded as %+v", d)
		}
	}
	// A plain heartbeat's encoding is unchanged by the new fields.
	b, err := fsm.Encode(plain)
	if err != nil || b[1] != byte(fsm.TypeSessionHeartbeat) {
		t.Fatalf("plain: % x, %v", b, err)
	}
	if _, err := fsm.Encode(&fsm.SessionHeartbeat{SessionID: "S", Metadata: map[string]string{"a": "1"}}); err == nil {
		t.Error("session heartbeat metadata without SetMetadata encoded")
	}
	zero := strings.Repeat("00", 32)
	for name, raw := range map[string][]byte{
		"heartbeat": append([]byte{versionJSON, byte(fsm.TypeSessionHeartbeat)}, `{"session_id":"S","token_hash":"`+zero+`","wall_ms":1,"set_metadata":true}`...),
		"type 26":   append([]byte{versionJSON, byte(fsm.TypeSessionHeartbeatMeta)}, `{"session_id":"S","token_hash":"`+zero+`","wall_ms":1}`...),
	} {
		if d, err := fsm.Decode(raw); err == nil {
			t.Errorf("version 1 %s decoded as %+v", name, d)
		}
	}
}
