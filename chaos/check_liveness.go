package chaos

import (
	"fmt"
	"sort"
	"time"
)

// LivenessBound is how long the cluster clock may stand still, as the
// harness sees it, while a healthy majority exists: a leader that commits
// nothing for 3 s gives leadership up (node's leader watchdog: a transfer,
// after 1 s a forced election), the new leader commits its first tick a
// period after its election (about 4.2 s after a leader's disk stalls, in
// all, on an idle machine), and the harness's tick sampler (one read at a
// time through a random node, up to 2 s each) adds its own delay; the
// rest is headroom for a loaded machine. Expiry follows the clock: a lease
// whose TTL has passed reads as expired within two ticks of the clock
// resuming (checkExpiryFollowsClock).
const LivenessBound = 10 * time.Second

// CheckLiveness checks that the cluster clock keeps moving whenever a
// healthy majority exists: between consecutive observed advances of the
// clock (successful tick reads that saw a higher tick than any read
// before), no stretch longer than bound lies outside the nemesis windows
// marked NoQuorum. So after a fault that left a majority healthy, or
// after a quorum-less window heals, the clock resumes within bound. end
// is the harness time the tick sampler stopped.
func CheckLiveness(ops []Op, events []Event, bound time.Duration, end int64) Verdict {
	v := Verdict{Checker: "liveness", Valid: true, Counts: map[string]int{}}
	reads, progress := clockAdvances(ops)
	v.Counts["reads"] = len(reads)
	v.Counts["advances"] = len(progress)
	if len(progress) == 0 {
		v.fail("no observed advance of the cluster clock: liveness not checked")
		return v
	}
	excused := excusedWindows(events, end)
	v.Counts["excused-windows"] = len(excused)
	points := append(progress, max(end, progress[len(progress)-1]))
	var worst int64
	for i := 1; i < len(points); i++ {
		a, b := points[i-1], points[i]
		free, at := longestFree(excused, a, b)
		worst = max(worst, free)
		if free > int64(bound) {
			v.Counts["stalls"]++
			what := "the clock did not advance"
			if i == len(points)-1 {
				what = "the clock never advanced again before the end of the run"
			}
			v.fail("%s for %.1f s (from %s, with a healthy majority; bound %v)", what, float64(free)/1e9, fmtT(at), bound)
		}
	}
	v.Counts["longest-stall-ms"] = int(worst / 1e6)
	if len(progress) < 2 && v.Valid {
		// One advance and no stall past the bound after it: too short a
		// run to tell.
		v.fail("only 1 observed advance of the cluster clock: liveness not checked")
		return v
	}
	countAdvancesAfterFaults(&v, events, progress)
	checkExpiryFollowsClock(&v, ops, reads)
	if v.Valid {
		v.Detail = fmt.Sprintf("with a healthy majority the cluster clock never stood still longer than %.1f s (bound %v), and due leases ended with it", float64(worst)/1e9, bound)
	} else if v.Counts["stalls"] == 0 {
		v.Detail = "a lease stayed active after the cluster clock had passed its expiry"
	} else {
		v.Detail = fmt.Sprintf("the cluster clock stood still for %.1f s while a majority was healthy (bound %v)", float64(worst)/1e9, bound)
	}
	return v
}

// expiryGraceTicks is how many ticks after its TTL, rounded up to whole
// ticks, a lease is due at the latest (the state machine's GraceTicks).
const expiryGraceTicks = 2

// clockAdvances returns the successful tick reads, by return time, and the
// return times of those that saw a higher tick than any read before.
func clockAdvances(ops []Op) (reads []Op, progress []int64) {
	for _, o := range ops {
		if o.Kind == KTick && o.Status == StatusOK {
			reads = append(reads, o)
		}
	}
	sort.Slice(reads, func(i, j int) bool { return reads[i].Return < reads[j].Return })
	var top int64 = -1
	for _, o := range reads {
		if o.Value > top {
			top = o.Value
			progress = append(progress, o.Return)
		}
	}
	return reads, progress
}

// span is a stretch of harness time, [a, b].
type span struct{ a, b int64 }

// excusedWindows returns the NoQuorum nemesis windows, by start (an
// unstopped one lasts to end).
func excusedWindows(events []Event, end int64) []span {
	var excused []span
	open := map[string]int64{}
	for _, e := range events {
		if e.Type != "nemesis" || !e.NoQuorum {
			continue
		}
		k := e.Name + "\x00" + e.Detail
		switch e.Phase {
		case "start":
			open[k] = e.Time
		case "stop":
			if a, ok := open[k]; ok {
				excused = append(excused, span{a, e.Time})
				delete(open, k)
			}
		}
	}
	for _, a := range open {
		excused = append(excused, span{a, end})
	}
	sort.Slice(excused, func(i, j int) bool { return excused[i].a < excused[j].a })
	return excused
}

// longestFree is the longest part of [a, b] outside every excused window
// (sorted by start), and where it begins.
func longestFree(excused []span, a, b int64) (int64, int64) {
	best, at, cur := int64(0), a, a
	for _, w := range excused {
		if w.b <= cur || w.a >= b {
			continue
		}
		if w.a > cur && w.a-cur > best {
			best, at = w.a-cur, cur
		}
		cur = max(cur, w.b)
	}
	if b > cur && b-cur > best {
		best, at = b-cur, cur
	}
	return best, at
}

// countAdvancesAfterFaults counts how soon the clock moved after each fault
// began and ended.
func countAdvancesAfterFaults(v *Verdict, events []Event, progress []int64) {
	for _, e := range events {
		if e.Type != "nemesis" || e.Phase == "" {
			continue
		}
		k := sort.Search(len(progress), func(i int) bool { return progress[i] > e.Time })
		if k == len(progress) {
			continue
		}
		ms := int((progress[k] - e.Time) / 1e6)
		name := "max-advance-after-fault-start-ms"
		if e.Phase == "stop" {
			name = "max-advance-after-fault-stop-ms"
		}
		v.Counts[name] = max(v.Counts[name], ms)
	}
}

// checkExpiryFollowsClock: a lease whose TTL has run out on the cluster
// clock is no longer active. A lease last extended (granted or renewed,
// acknowledged) by time x was extended at a tick no higher than the first
// tick read called after x, u; with a TTL of n ticks it is due when tick
// u+n+expiryGraceTicks has committed at the latest. A read of the key
// called after a tick read had returned that tick or more must not show it
// active. Leases with an indeterminate grant or renewal (which may take
// effect later) are skipped. With the clock's liveness, a due lease thus
// reads as ended within its TTL plus LivenessBound while a majority is
// healthy.
//
// The bound is the one README states. A due lease reads as expired (and
// its token is refused) from that tick on, whatever the chunking: when
// more than 4,096 records come due at once, the leader ends them in
// chunks of 4,096, the tick's entry and Expire entries right after it,
// and a due lease keeps its slot (a new acquire waits) until its chunk
// commits, but no read shows it active meanwhile. So this check allows no
// extra tick for a storm; the slot's end it does not check.
func checkExpiryFollowsClock(v *Verdict, ops []Op, ticks []Op) {
	if len(ticks) == 0 {
		return
	}
	type ext struct {
		last  int64
		ttl   int64
		vague bool
	}
	exts := map[string]*ext{}
	for _, o := range ops {
		if (o.Kind != KAcquire && o.Kind != KRenew) || o.LeaseID == "" {
			continue
		}
		e := exts[o.LeaseID]
		if e == nil {
			e = &ext{}
			exts[o.LeaseID] = e
		}
		switch o.Status {
		case StatusOK:
			if o.Return > e.last {
				e.last, e.ttl = o.Return, o.TTLMS
			}
		case StatusInfo:
			e.vague = true
		}
	}
	byCall := append([]Op(nil), ticks...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	byReturn := ticks // sorted by Return
	for _, o := range ops {
		if o.Kind != KRead || o.Status != StatusOK || o.LeaseID == "" {
			continue
		}
		e := exts[o.LeaseID]
		if e == nil || e.vague || e.last == 0 || e.ttl <= 0 {
			continue
		}
		k := sort.Search(len(byCall), func(i int) bool { return byCall[i].Call >= e.last })
		if k == len(byCall) {
			continue
		}
		u, period := byCall[k].Value, byCall[k].PeriodMS
		if period <= 0 {
			continue
		}
		due := u + (e.ttl+period-1)/period + expiryGraceTicks
		v.Counts["expiry-checked"]++
		// The highest tick known committed before the read was called.
		var seen int64 = -1
		for _, t := range byReturn {
			if t.Return >= o.Call {
				break
			}
			seen = max(seen, t.Value)
		}
		if seen >= due {
			v.Counts["expiry-late"]++
			v.fail("lease %s (key %s, TTL %d ms, last extended by %s at tick <= %d) read active at %s although tick %d had committed (due at %d)",
				o.LeaseID, o.Key, e.ttl, fmtT(e.last), u, fmtT(o.Call), seen, due)
		}
	}
}
