package fsm_test

import (
	"encoding/json"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// TestStateText: a state is written and read by its name, in JSON as in
// text, and an unknown name is an error.
func TestStateText(t *testing.T) {
	for _, st := range []fsm.State{fsm.StateActive, fsm.StateReleased, fsm.StateExpired, fsm.StateRevoked, fsm.SessionEnded} {
		b, err := json.Marshal(struct{ S fsm.State }{st})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"S":"` + st.String() + `"}`; string(b) != want {
			t.Fatalf("%v: %s, want %s", st, b, want)
		}
		var back struct{ S fsm.State }
		if err := json.Unmarshal(b, &back); err != nil || back.S != st {
			t.Fatalf("%s read back as %v (%v)", b, back.S, err)
		}
		if p, ok := fsm.ParseState(st.String()); !ok || p != st {
			t.Fatalf("ParseState(%q) = %v, %v", st.String(), p, ok)
		}
	}
	if fsm.SessionActive.String() != "active" || fsm.SessionExpired.String() != "expired" || fsm.SessionEnded.String() != "ended" {
		t.Fatal("session states not named as before")
	}
	var s struct{ S fsm.State }
	if err := json.Unmarshal([]byte(`{"S":"gone"}`), &s); err == nil {
		t.Fatal("an unknown state name was read")
	}
	if _, ok := fsm.ParseState("gone"); ok {
		t.Fatal("ParseState accepted an unknown name")
	}
}
