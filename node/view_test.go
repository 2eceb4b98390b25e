package node

import (
	"reflect"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// leaseViewRef is leaseView as it was written before it filled the view in
// place and computed expires_at in whole milliseconds: the reference the
// rendering must still equal, field for field.
func leaseViewRef(l *fsm.Lease, state fsm.State, endTick uint64, ttlMS int64, tick uint64, period int64, now time.Time) *wire.Lease {
	v := &wire.Lease{
		LeaseID: l.ID, Key: l.Key, Holder: l.Holder, Limit: uint32(l.Limit), SessionID: l.SessionID, GroupID: l.GroupID(),
		State: state.String(), FencingToken: l.Fence, TTLMS: ttlMS,
		AcquiredAt: wallTime(l.AcquiredWallMS), HeartbeatIntervalMS: ttlMS / 3,
		RenewalCount: l.RenewalCount, Metadata: l.Metadata(), EndReason: l.EndReason(),
	}
	v.LastRenewedAt, v.EndedAt = optTime(l.RenewedWallMS), optTime(l.EndedWallMS())
	switch {
	case state == fsm.StateActive:
		v.RemainingMS = remaining(endTick, tick, period)
		v.ExpiresAt = now.Add(time.Duration(v.RemainingMS) * time.Millisecond).UTC().Truncate(time.Millisecond)
	case v.EndedAt != nil:
		v.ExpiresAt = *v.EndedAt
	case l.State == fsm.StateActive:
		v.ExpiresAt = now.UTC().Truncate(time.Millisecond)
	}
	return v
}

// TestLeaseViewMatchesReference renders leases an FSM made (acquired with
// metadata, renewed, released) in each state they can be read in, at
// moments with and without a monotonic reading and sub-millisecond parts,
// and compares every field with the reference rendering.
func TestLeaseViewMatchesReference(t *testing.T) {
	const period = 100
	wall := int64(1_790_000_000_123)
	f := fsm.New()
	apply := func(i uint64, c fsm.Command) *fsm.Lease {
		t.Helper()
		res := f.Apply(i, c)
		if len(res) != 1 || res[0].Err != nil {
			t.Fatalf("apply %T: %+v", c, res)
		}
		return res[0].Lease
	}
	apply(1, &fsm.Tick{Tick: 10, WallMS: wall, PeriodMS: period, RetainTicks: 36000})
	tok := fsm.Hash{1}
	acquired := apply(2, &fsm.Acquire{LeaseID: "l_view", Key: "view/key", Holder: "h", Limit: 1, TokenHash: tok,
		TTLMS: 5000, TTLTicks: 50, Metadata: map[string]string{"a": "b"}, WallMS: wall + 7})
	renewed := apply(3, &fsm.Renew{LeaseID: "l_view", TokenHash: tok, WallMS: wall + 1234})
	released := apply(4, &fsm.Release{LeaseID: "l_view", TokenHash: tok, Reason: "done", WallMS: wall + 2345})
	if renewed.RenewedWallMS == 0 || released.EndedWallMS() == 0 || acquired.Metadata() == nil {
		t.Fatalf("the FSM did not make the leases this test needs: %+v %+v", renewed, released)
	}
	nows := []time.Time{
		time.Now(), // with a monotonic reading
		time.UnixMilli(wall).Add(999_999 * time.Nanosecond),
		time.Unix(1_790_000_000, 0).In(time.FixedZone("x", 3600)),
		time.UnixMilli(wall).Add(1),
	}
	cases := []struct {
		name  string
		l     *fsm.Lease
		state fsm.State
		tick  uint64
	}{
		{"acquired", acquired, fsm.StateActive, 12},
		{"renewed", renewed, fsm.StateActive, 13},
		{"past its end tick", renewed, fsm.StateActive, 1000},
		{"due", renewed, fsm.StateExpired, 1000},
		{"released", released, released.State, 14},
	}
	for _, c := range cases {
		for _, now := range nows {
			got := leaseView(c.l, c.state, c.l.ExpiresTick, c.l.TTLMS, c.tick, period, now)
			want := leaseViewRef(c.l, c.state, c.l.ExpiresTick, c.l.TTLMS, c.tick, period, now)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s at %v:\n got  %+v\n want %+v", c.name, now, got, want)
			}
		}
	}
}

// BenchmarkLeaseView renders an active, renewed lease: what every renewal's
// answer costs.
func BenchmarkLeaseView(b *testing.B) {
	l := &fsm.Lease{ID: "l_0123456789abcdef", Key: "bench/key", Holder: "bench", Limit: 1, State: fsm.StateActive,
		RenewalCount: 7, Fence: 42, TTLMS: 10000, TTLTicks: 100, ExpiresTick: 1100, AcquiredTick: 1000,
		AcquiredWallMS: 1_790_000_000_000, RenewedWallMS: 1_790_000_005_000}
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		v := leaseView(l, fsm.StateActive, l.ExpiresTick, l.TTLMS, 1050, 100, now)
		if v.RemainingMS != 5000 {
			b.Fatal(v.RemainingMS)
		}
	}
}
