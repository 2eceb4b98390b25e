package chaos

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdict is one checker's result.
type Verdict struct {
	Checker string `json:"checker"`
	// Valid is false on a violation, an inconclusive check (porcupine's
	// Unknown) or an ineffective run.
	Valid   bool           `json:"valid"`
	Detail  string         `json:"detail,omitempty"`
	Counts  map[string]int `json:"counts,omitempty"`
	Samples []string       `json:"samples,omitempty"`
}

func (v *Verdict) fail(format string, args ...any) {
	v.Valid = false
	if len(v.Samples) < 10 {
		v.Samples = append(v.Samples, fmt.Sprintf(format, args...))
	}
}

// CheckLinearizable checks every key's lease operations against LeaseModel.
// An Unknown result (the search timed out) is a failure, not a pass. It
// returns the porcupine info for the visualization.
func CheckLinearizable(ops []Op, eps float64, timeout time.Duration) (Verdict, porcupine.LinearizationInfo) {
	v := Verdict{Checker: "linearizable", Valid: true, Counts: map[string]int{}}
	pops := porcupineOps(ops)
	v.Counts["operations"] = len(pops)
	keys := map[string]bool{}
	for _, o := range pops {
		keys[o.Input.(Op).Key] = true
	}
	v.Counts["keys"] = len(keys)
	res, info := porcupine.CheckOperationsVerbose(LeaseModel(eps), pops, timeout)
	switch res {
	case porcupine.Ok:
		v.Detail = "every key's history is linearizable with TTL expiry"
	case porcupine.Illegal:
		v.Valid = false
		v.Detail = "not linearizable: see linearizability.html for the longest linearizable prefix of each failing key"
		// Name the failing keys (each checked briefly, at most 20 keys:
		// an illegal history can take the search long to refute).
		for i, part := range partitionByKey(pops) {
			if i >= 20 {
				break
			}
			if porcupine.CheckOperationsTimeout(LeaseModel(eps), part, min(timeout, 3*time.Second)) != porcupine.Ok {
				v.Counts["illegal-keys"]++
				v.fail("key %s (%d operations) has no linearization", part[0].Input.(Op).Key, len(part))
			}
		}
	default:
		v.Valid = false
		v.Detail = fmt.Sprintf("inconclusive: the check did not finish within %v (counted as a failure)", timeout)
	}
	return v, info
}

// window is the interval in which a client believed it held a lease.
type window struct {
	Key, LeaseID   string
	Worker         int
	Fence          uint64
	Start, End     int64
	EndReason      string
	AcquireOpIndex int
}

// holderWindows derives, per key, the intervals in which clients believed
// they held a lease: from the acquire's acknowledgement until the earliest
// of the release's send time, the client giving up (an error or an info
// operation on it), and the last successful grant or renewal's send time +
// TTL*(1-eps). A renewal answered after that deadline ends the interval at
// the deadline and starts another at its answer.
func holderWindows(ops []Op, eps float64, end int64) []window {
	type live struct {
		w        window
		deadline int64
	}
	sorted := append([]Op(nil), ops...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Call < sorted[j].Call })
	open := map[string]*live{} // lease id -> window
	var out []window
	closeW := func(l *live, at int64, why string) {
		if at > l.deadline {
			at, why = l.deadline, "deadline"
		}
		l.w.End, l.w.EndReason = at, why
		out = append(out, l.w)
		delete(open, l.w.LeaseID)
	}
	ttl := func(o Op) int64 { return int64(float64(o.TTLMS*1e6) * (1 - eps)) }
	for i, o := range sorted {
		switch o.Kind {
		case KAcquire:
			if o.Status == StatusOK && o.LeaseID != "" {
				open[o.LeaseID] = &live{w: window{Key: o.Key, LeaseID: o.LeaseID, Worker: o.Worker, Fence: o.Fence,
					Start: o.Return, AcquireOpIndex: i}, deadline: o.Call + ttl(o)}
			}
		case KRenew:
			l := open[o.LeaseID]
			if l == nil || o.Stale {
				continue
			}
			switch o.Status {
			case StatusOK:
				d := o.Call + ttl(o)
				if o.Return > l.deadline {
					// Answered only after the holder's own deadline: its
					// belief ended there (a KeepAlive reports the lease
					// lost at its deadline, whatever is in flight) and
					// starts again with the answer. Meanwhile the lease
					// may have expired, its key gone to others, and a
					// restore brought it back from a backup (with a new
					// fencing token, and the same secret token, which
					// the renewal then renewed).
					w := l.w
					closeW(l, l.deadline, "deadline")
					if d > o.Return {
						w.Start, w.AcquireOpIndex = o.Return, i
						open[o.LeaseID] = &live{w: w, deadline: d}
					}
				} else if d > l.deadline {
					l.deadline = d
				}
			case StatusFail:
				closeW(l, o.Return, "renew failed: "+orDefault(o.Code, o.Err))
			default:
				closeW(l, o.Call, "renew indeterminate")
			}
		case KRelease:
			if l := open[o.LeaseID]; l != nil && !o.Stale {
				closeW(l, o.Call, "release")
			}
		}
	}
	for _, l := range open {
		closeW(l, end, "end of run")
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].Start < out[j].Start
	})
	return out
}

// CheckHolderWindows checks that, per key, no two clients believed they
// held the key at the same time.
func CheckHolderWindows(ops []Op, eps float64, end int64) (Verdict, []window) {
	v := Verdict{Checker: "holder-windows", Valid: true, Counts: map[string]int{}}
	ws := holderWindows(ops, eps, end)
	v.Counts["windows"] = len(ws)
	var lastEnd int64
	var last *window
	for i := range ws {
		w := &ws[i]
		if w.End <= w.Start {
			// Acknowledged only after the client's own deadline (send
			// time + TTL*(1-eps)): it never believed it held the key.
			v.Counts["late-acks"]++
			continue
		}
		if last != nil && last.Key == w.Key && w.Start < lastEnd {
			v.Counts["overlaps"]++
			v.fail("key %s: %s (worker %d, fence %d) held from %s while %s (worker %d, fence %d) held until %s",
				w.Key, w.LeaseID, w.Worker, w.Fence, fmtT(w.Start), last.LeaseID, last.Worker, last.Fence, fmtT(lastEnd))
		}
		if last == nil || last.Key != w.Key || w.End > lastEnd {
			lastEnd = w.End
			last = w
		}
	}
	if v.Valid {
		v.Detail = "no two holders of a key believed they held it at the same time"
	}
	return v, ws
}

// CheckFencing checks that fencing tokens strictly increase per key in
// real-time order: a grant acknowledged before another was sent has the
// lower token. Grants from every phase of the run (across restarts) count.
func CheckFencing(ops []Op) Verdict {
	v := Verdict{Checker: "fencing", Valid: true, Counts: map[string]int{}}
	byKey := map[string][]Op{}
	for _, o := range ops {
		if o.Kind == KAcquire && o.Status == StatusOK {
			byKey[o.Key] = append(byKey[o.Key], o)
		}
	}
	for key, gs := range byKey {
		v.Counts["grants"] += len(gs)
		sort.Slice(gs, func(i, j int) bool { return gs[i].Return < gs[j].Return })
		// For each grant, every grant acknowledged before its call must
		// have a lower token: compare with the running maximum.
		var maxFence uint64
		var maxOp Op
		j := 0
		byCall := append([]Op(nil), gs...)
		sort.Slice(byCall, func(a, b int) bool { return byCall[a].Call < byCall[b].Call })
		for _, g := range byCall {
			for j < len(gs) && gs[j].Return < g.Call {
				if gs[j].Fence > maxFence {
					maxFence, maxOp = gs[j].Fence, gs[j]
				}
				j++
			}
			if g.Fence <= maxFence {
				v.Counts["violations"]++
				v.fail("key %s: %s got fence %d at %s after %s had fence %d at %s",
					key, g.LeaseID, g.Fence, fmtT(g.Call), maxOp.LeaseID, maxFence, fmtT(maxOp.Return))
			}
		}
	}
	if v.Valid {
		v.Detail = "fencing tokens strictly increase per key in real-time order"
	}
	return v
}

// CheckCounter checks the fenced counter: the resource accepted writes in a
// single chain, each write's value one more than the value its writer read,
// and no two leases' accepted writes carried one token. The resource itself
// refuses a token below the highest it has seen, so an accepted token below
// an earlier one cannot happen whatever the service does; an equal token of
// another lease it must accept, and only the service can have issued it:
// the resource could not tell the two holders apart.
func CheckCounter(ops []Op) Verdict {
	v := Verdict{Checker: "fenced-counter", Valid: true, Counts: map[string]int{}}
	byKey := map[string][]Op{}
	for _, o := range ops {
		switch o.Kind {
		case KWrite:
			switch o.Status {
			case StatusOK:
				v.Counts["writes-accepted"]++
				byKey[o.Key] = append(byKey[o.Key], o)
			case StatusFail:
				if o.Code == CodeStaleFence {
					v.Counts["stale-token-rejected"]++
				}
			}
		case KCounterRead:
			if o.Status == StatusFail && o.Code == CodeStaleFence {
				v.Counts["stale-token-rejected"]++
			}
		}
	}
	for key, ws := range byKey {
		// Writes are serialised by the resource: Return order is the
		// acceptance order (the resource stamps it under its lock).
		sort.Slice(ws, func(i, j int) bool { return ws[i].Return < ws[j].Return })
		var prev int64
		var prevFence uint64
		var prevLease string
		for _, w := range ws {
			if w.Value != prev+1 {
				v.Counts["lost-updates"]++
				v.fail("key %s: write of %d by %s (fence %d) followed value %d: an update was lost or duplicated",
					key, w.Value, w.LeaseID, w.Fence, prev)
			}
			if prevLease != "" && w.LeaseID != prevLease && w.Fence <= prevFence {
				v.Counts["shared-tokens"]++
				v.fail("key %s: %s's write with fence %d accepted after %s's with fence %d: two leases carried one token",
					key, w.LeaseID, w.Fence, prevLease, prevFence)
			}
			prev, prevFence, prevLease = w.Value, w.Fence, w.LeaseID
		}
	}
	if v.Valid {
		v.Detail = "accepted counter writes form one chain with no lost update"
	}
	return v
}

// LeaseLookup reads a lease by id linearizably; found=false for
// LEASE_NOT_FOUND.
type LeaseLookup func(ctx context.Context, id string) (state string, fence uint64, found bool, err error)

// CheckNoLostAcks reads back every acknowledged grant and release after the
// cluster healed: each granted lease still exists with its fencing token,
// and each acknowledged release shows the lease released (a lease released
// after it expired may show expired).
func CheckNoLostAcks(ctx context.Context, ops []Op, lookup LeaseLookup) Verdict {
	v := Verdict{Checker: "no-lost-acks", Valid: true, Counts: map[string]int{}}
	granted := map[string]Op{}
	released := map[string]bool{}
	for _, o := range ops {
		if o.Status != StatusOK {
			continue
		}
		switch {
		case o.Kind == KAcquire && o.LeaseID != "":
			granted[o.LeaseID] = o
		case o.Kind == KRelease && !o.Stale:
			released[o.LeaseID] = true
		}
	}
	ids := make([]string, 0, len(granted))
	for id := range granted {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	rewound := rewoundByRestore(ops)
	for _, id := range ids {
		g := granted[id]
		if rewound(id) {
			// It may have ended before a restore, which then put the
			// file's version in its place (or none).
			v.Counts["rewound-by-restore"]++
			continue
		}
		state, fence, found, err := lookup(ctx, id)
		if err != nil {
			v.Counts["unreadable"]++
			v.fail("read %s: %v", id, err)
			continue
		}
		v.Counts["checked"]++
		if !found {
			v.Counts["lost"]++
			v.fail("acknowledged lease %s (key %s, fence %d) is gone", id, g.Key, g.Fence)
			continue
		}
		if fence != g.Fence {
			v.fail("lease %s has fence %d, was granted %d", id, fence, g.Fence)
		}
		if released[id] {
			v.Counts["releases-checked"]++
			if state != "released" && state != "expired" {
				v.Counts["lost"]++
				v.fail("acknowledged release of %s lost: state %s", id, state)
			}
		}
	}
	if v.Valid {
		v.Detail = "every acknowledged grant and release is in the final state"
	}
	return v
}

// rewoundByRestore returns whether a restore may have replaced a lease's
// record: the lease may have ended before a restore took effect (a restore
// keeps every lease live at that moment as it is). A lease may have ended
// by the restore's return if a release of it was sent before then, or if
// half its TTL after its last refresh answered before the restore was sent
// had passed by then (half: a generous bound on when the server may expire
// it, whatever eps).
func rewoundByRestore(ops []Op) func(id string) bool {
	type window struct {
		call, ret int64             // a restore took effect in [call, ret]
		restored  map[string]string // its file's active leases: key -> id
	}
	var at []window
	for _, o := range ops {
		if o.Kind == KRestore && o.Status != StatusFail {
			r := o.Return
			if o.Status == StatusInfo {
				r = math.MaxInt64
			}
			at = append(at, window{o.Call, r, o.Restored})
		}
	}
	if len(at) == 0 {
		return func(string) bool { return false }
	}
	byLease := map[string][]Op{}
	for _, o := range ops {
		if o.LeaseID != "" && !o.Stale && (o.Kind == KAcquire || o.Kind == KRenew || o.Kind == KRelease) {
			byLease[o.LeaseID] = append(byLease[o.LeaseID], o)
		}
	}
	return func(id string) bool {
		for _, r := range at {
			var refresh, ttl int64 = -1, 0
			for _, o := range byLease[id] {
				if o.Call >= r.ret {
					continue
				}
				if o.Kind == KRelease {
					return true
				}
				// Only a refresh answered before the restore was sent
				// surely applied before it: one answered later may have
				// renewed the restored record (the file's, re-fenced,
				// which takes the same token) after the lease had
				// ended in the state the restore replaced. A grant
				// the file holds applied before the restore however
				// late it was answered, at its send time or later.
				early := o.Return < r.call || o.Kind == KAcquire && r.restored[o.Key] == id
				if o.Status == StatusOK && early && o.Call > refresh {
					refresh, ttl = o.Call, o.TTLMS*1e6
				}
			}
			if refresh >= 0 && refresh+ttl/2 < r.ret {
				return true
			}
		}
		return false
	}
}

// CheckLogs scans node logs for panics, data races and corruption.
func CheckLogs(logs map[string]string) Verdict {
	v := Verdict{Checker: "logs-clean", Valid: true, Counts: map[string]int{}}
	bad := []string{"panic:", "DATA RACE", "fatal error:", "corrupt", "checksum mismatch", "concurrent map"}
	names := make([]string, 0, len(logs))
	for n := range logs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		v.Counts["logs"]++
		for i, line := range strings.Split(logs[name], "\n") {
			for _, b := range bad {
				if strings.Contains(line, b) {
					v.Counts["bad-lines"]++
					v.fail("%s:%d: %s", name, i+1, truncate(line, 200))
					break
				}
			}
		}
	}
	if v.Valid {
		v.Detail = "no panic, race or corruption message in any node log"
	}
	return v
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func fmtT(ns int64) string { return fmt.Sprintf("%.3fs", float64(ns)/1e9) }

// CheckClock checks the cluster clock against the harness's: ticks never
// go back (a read that begins after another ended sees at least its tick)
// and never run faster than real time. For linearizable tick reads a (call c1, tick
// k1) and b (return r2, tick k2): tick k1+1 was committed after a began,
// so tick k1+2 was proposed after c1, and tick k2 before r2; the leader
// spaces ticks at least a period apart, across leader changes too (a new
// leader waits a period after its election). So
// (k2-k1-2) * period * (1-eps) <= r2 - c1 for every such pair.
func CheckClock(ops []Op, eps float64) Verdict {
	v := Verdict{Checker: "clock", Valid: true, Counts: map[string]int{}}
	var reads []Op
	for _, o := range ops {
		if o.Kind == KTick && o.Status == StatusOK && o.PeriodMS > 0 {
			reads = append(reads, o)
		}
	}
	v.Counts["reads"] = len(reads)
	worst := 0.0
	for _, a := range reads {
		for _, b := range reads {
			if b.Call > a.Return && b.Value < a.Value {
				// Ticks never go back, not even across a restore.
				v.Counts["went-back"]++
				v.fail("tick %d read at %s after tick %d was read at %s: the clock went back",
					b.Value, fmtT(b.Return), a.Value, fmtT(a.Return))
				continue
			}
			if b.Return <= a.Call || b.Value < a.Value+3 {
				continue
			}
			v.Counts["pairs"]++
			need := float64(b.Value-a.Value-2) * float64(a.PeriodMS) * 1e6 * (1 - eps)
			got := float64(b.Return - a.Call)
			if got > 0 && need/got > worst {
				worst = need / got
			}
			if need > got {
				v.Counts["violations"]++
				v.fail("ticks %d -> %d (%d periods of %d ms) between %s and %s: %.0f ms of real time",
					a.Value, b.Value, b.Value-a.Value-2, a.PeriodMS, fmtT(a.Call), fmtT(b.Return), got/1e6)
			}
		}
	}
	if len(reads) < 2 {
		v.fail("only %d successful tick reads: the clock was not checked", len(reads))
	}
	if v.Valid {
		v.Detail = fmt.Sprintf("the cluster clock never ran faster than real time (fastest: %.2f of the bound)", worst)
	}
	return v
}
