package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
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
