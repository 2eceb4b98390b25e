package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestLeaseJSONIsEncodingJSONs: appendLeaseJSON writes the bytes
// encoding/json writes for any lease (random ones: strings that need
// escaping, times in other zones and at the edges of RFC 3339, absent and
// present optional fields), and gives up exactly where encoding/json
// refuses.
func TestLeaseJSONIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	strs := []string{"", "a", "jobs/1", "camera 7", `quo"te`, `back\slash`, "<html>&", "a<b", "x>y", "p&q", "tab\there", "nl\n", "\x00\x1f",
		"é", "日本", "\u2028\u2029", "bad\xffutf8", "ls_0123456789abcdef", "~!@#$%^*()_+{}|:?,./;'[]=-`"}
	str := func() string { return strs[rng.IntN(len(strs))] + strs[rng.IntN(len(strs))] }
	zones := []*time.Location{time.UTC, time.FixedZone("x", 5*3600+30*60), time.FixedZone("y", -8*3600), time.FixedZone("s", 3600+17),
		time.FixedZone("edge", 23*3600+59*60), time.FixedZone("over", 24*3600), time.FixedZone("under", -24*3600)}
	tm := func() time.Time {
		switch rng.IntN(8) {
		case 0:
			return time.Time{}
		case 1:
			return time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
		case 2:
			return time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)
		case 3:
			return time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
		}
		return time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).In(zones[rng.IntN(len(zones))])
	}
	refused := 0
	for i := range 20000 {
		l := &wire.Lease{LeaseID: str(), Key: str(), Holder: str(), Limit: rng.Uint32(), State: str(),
			FencingToken: rng.Uint64(), TTLMS: rng.Int64() - rng.Int64(), RemainingMS: -rng.Int64N(100),
			ExpiresAt: tm(), AcquiredAt: tm(), HeartbeatIntervalMS: rng.Int64N(1e6), RenewalCount: rng.Uint32()}
		if rng.IntN(2) == 0 {
			l.SessionID, l.GroupID, l.EndReason, l.Token, l.Grant = str(), str(), str(), str(), str()
		}
		if rng.IntN(2) == 0 {
			a, b := tm(), tm()
			l.LastRenewedAt, l.EndedAt = &a, &b
		}
		if rng.IntN(3) == 0 {
			l.Metadata = map[string]string{}
			for range rng.IntN(4) {
				l.Metadata[str()] = str()
			}
		}
		want, err := json.Marshal(l)
		got, ok := appendLeaseJSON(nil, l)
		if err != nil {
			if ok {
				t.Fatalf("lease %d: encoding/json refuses it (%v), appendLeaseJSON wrote %s", i, err, got)
			}
			refused++
			continue
		}
		if !ok {
			t.Fatalf("lease %d: appendLeaseJSON refused a lease encoding/json writes: %s", i, want)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("lease %d:\n got %s\nwant %s", i, got, want)
		}
	}
	if refused == 0 || refused > 15000 {
		t.Fatalf("%d of 20000 leases refused: the edge cases are not exercised", refused)
	}
	var nilLease *wire.Lease
	want, _ := json.Marshal(nilLease)
	if got, ok := appendLeaseJSON(nil, nil); !ok || !bytes.Equal(got, want) {
		t.Fatalf("nil lease: %s, want %s", got, want)
	}
}

// TestKeepAliveJSONIsEncodingJSONs: appendKeepAliveJSON writes the bytes
// encoding/json writes for any answer without an error, and leaves those
// with one (and times encoding/json refuses) to encoding/json.
func TestKeepAliveJSONIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	strs := []string{"", "ls_0123456789abcdef", `quo"te`, "<&>", "é", "bad\xffutf8", "\u2028"}
	written, refused := 0, 0
	for i := range 20000 {
		a := &wire.KeepAliveAnswer{ID: rng.Uint64() >> rng.IntN(64), LeaseID: strs[rng.IntN(len(strs))], OK: rng.IntN(2) == 0}
		if rng.IntN(4) > 0 {
			a.FencingToken, a.TTLMS, a.RemainingMS, a.RenewalCount = rng.Uint64()>>rng.IntN(64), rng.Int64()-rng.Int64(), rng.Int64N(3)-1, rng.Uint32()>>rng.IntN(32)
		}
		switch rng.IntN(4) {
		case 0:
			at := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).UTC()
			a.ExpiresAt = &at
		case 1:
			at := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
			a.ExpiresAt = &at
		}
		if rng.IntN(5) == 0 {
			a.Status, a.Error = 400+rng.IntN(200), &wire.Error{Code: wire.CodeInvalidArgument, Message: "m"}
		} else if rng.IntN(5) == 0 {
			a.Status = 200
		}
		want, err := json.Marshal(a)
		got, ok := appendKeepAliveJSON([]byte("prefix"), a)
		if !ok {
			if err == nil && a.Error == nil {
				t.Fatalf("answer %d: refused an answer encoding/json writes: %s", i, want)
			}
			refused++
			continue
		}
		if err != nil || a.Error != nil {
			t.Fatalf("answer %d: wrote %s for an answer with an error or that encoding/json refuses (%v)", i, got, err)
		}
		if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("answer %d:\n got %s\nwant prefix%s", i, got, want)
		}
		written++
	}
	if written < 10000 || refused < 1000 {
		t.Fatalf("%d written, %d refused of 20000: the cases are not exercised", written, refused)
	}
}

// TestKeepAliveLineReadsAsEncodingJSON: parseKeepAliveLine reads the Go
// client's lines itself, and every line it accepts (among random edits of
// such lines) reads as encoding/json reads it; what it refuses is left to
// encoding/json.
func TestKeepAliveLineReadsAsEncodingJSON(t *testing.T) {
	for _, r := range []wire.KeepAliveRenewal{
		{ID: 1, LeaseID: "ls_0123456789abcdef", Token: "tok-abc_DEF"},
		{ID: 123456789012, LeaseID: "ls_x", Token: "t", TTLMS: 30000},
		{ID: 0, LeaseID: "", Token: ""},
	} {
		line, _ := json.Marshal(r)
		var got wire.KeepAliveRenewal
		if ok := parseKeepAliveLine(line, &got); !ok || got.ID != r.ID || got.LeaseID != r.LeaseID || got.Token != r.Token || got.TTLMS != r.TTLMS {
			t.Fatalf("%s: read %+v (accepted: %v), want %+v", line, got, ok, r)
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	alphabet := []byte(`{}":,0123456789-.eE \\/tuabcdefghijklmnopqrsxyzI_\x00` + "\xff\xc3")
	fields := []string{`"id":7`, `"id":0`, `"id":01`, `"id":-1`, `"id":1.5`, `"id":1e3`, `"id":18446744073709551615`, `"id":99999999999999999999`,
		`"lease_id":"ls_a"`, `"lease_id":"a\"b"`, `"lease_id":"\u0041"`, `"lease_id":"é"`, `"lease_id":null`, `"lease_id":5`,
		`"token":"t"`, `"token":""`, `"Token":"T"`, `"ttl_ms":1000`, `"ttl_ms":-5`, `"ttl_ms":0`, `"metadata":{"a":"b"}`, `"metadata":null`, `"other":1`}
	accepted := 0
	for i := range 50000 {
		parts := make([]string, 1+rng.IntN(5))
		for j := range parts {
			parts[j] = fields[rng.IntN(len(fields))]
		}
		line := []byte("{" + strings.Join(parts, ",") + "}")
		for range rng.IntN(3) {
			switch k := rng.IntN(len(line)); rng.IntN(3) {
			case 0:
				line[k] = alphabet[rng.IntN(len(alphabet))]
			case 1:
				line = append(line[:k], line[k+1:]...)
			default:
				line = append(line[:k], append([]byte{alphabet[rng.IntN(len(alphabet))]}, line[k:]...)...)
			}
			if len(line) == 0 {
				line = []byte("{")
			}
		}
		var fast, slow wire.KeepAliveRenewal
		if !parseKeepAliveLine(line, &fast) {
			continue
		}
		accepted++
		if err := json.Unmarshal(line, &slow); err != nil {
			t.Fatalf("line %d %q: accepted, but encoding/json refuses it: %v", i, line, err)
		}
		if slow.Metadata != nil || fast.ID != slow.ID || fast.LeaseID != slow.LeaseID || fast.Token != slow.Token || fast.TTLMS != slow.TTLMS {
			t.Fatalf("line %d %q: read %+v, encoding/json reads %+v", i, line, fast, slow)
		}
	}
	if accepted < 1000 {
		t.Fatalf("%d of 50000 lines accepted: the fast path is not exercised", accepted)
	}
}
