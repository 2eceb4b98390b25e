package api

import (
	"encoding/json"
	"testing"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// FuzzControlMessage feeds arbitrary bytes to the control socket's message
// decoder: it never panics, answers exactly one of a message or an
// INVALID_ARGUMENT error, and what it accepts is within the protocol's
// bounds and survives a round trip.
func FuzzControlMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"control.acquire","requestId":"req-101","clientName":"K1 Composer","clientInstanceId":"6f0d84a3-8f49-4da8-8c70-0b8f6db5a870","scope":"global"}`,
		`{"type":"control.heartbeat","requestId":"req-102","leaseId":"cl_9f4a2137c1d6","leaseToken":"2Ab8P9Qk0kY2eP7nX7c2Yw"}`,
		`{"type":"control.release","requestId":"req-103","leaseId":"cl_9f4a2137c1d6","leaseToken":"2Ab8P9Qk0kY2eP7nX7c2Yw","reason":"user_exit"}`,
		`{ "type": "control.status", "requestId": "req-104" }`,
		`{"type":"control.acquire","ttlMs":1000,"heartbeatIntervalMs":200}`,
		`{"type":"control.acquire","scope":"local"}`, `{"type":1}`, `[]`, `null`, ``, `{"type":"control.status"} x`,
		`{"type":"control.heartbeat","leaseId":"","leaseToken":"a"}`, "{\"type\":\"control.status\",\"requestId\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeControlMessage(b, DefaultControlMaxTTL.Milliseconds())
		if (m == nil) == (err == nil) {
			t.Fatalf("message %v and error %v", m, err)
		}
		if err != nil {
			if err.Code != wire.CodeInvalidArgument || err.Message == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		switch m.Type {
		case "control.acquire":
			if m.TTLMS != 0 && (m.TTLMS < 1000 || m.TTLMS > DefaultControlMaxTTL.Milliseconds()) || m.HeartbeatIntervalMS < 0 ||
				len(m.ClientName) > node.MaxControlNameBytes || len(m.ClientInstanceID) > node.MaxControlNameBytes {
				t.Fatalf("accepted out-of-bounds acquire %+v", m)
			}
		case "control.heartbeat", "control.release":
			if m.LeaseID == "" || m.LeaseToken == "" || len(m.LeaseID) > 64 || len(m.LeaseToken) > maxLeaseTokenBytes || len(m.Reason) > 256 ||
				m.Reason == node.ReasonOwnerDisconnected || m.Reason == node.ReasonTimedOut {
				t.Fatalf("accepted %+v", m)
			}
		case "control.status":
		default:
			t.Fatalf("accepted type %q", m.Type)
		}
		if m.Scope != "" && m.Scope != "global" || len(m.RequestID) > maxRequestIDBytes {
			t.Fatalf("accepted %+v", m)
		}
		again, _ := json.Marshal(m)
		m2, err := decodeControlMessage(again, DefaultControlMaxTTL.Milliseconds())
		if err != nil || *m2 != *m {
			t.Fatalf("round trip of %+v: %+v, %v", m, m2, err)
		}
	})
}
