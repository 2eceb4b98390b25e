package chaos

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHolderWindows(t *testing.T) {
	ok := []Op{
		acq(0, "k", "A", 1, 0, 10),
		op(0, KRelease, "k", "A", 300, 310, StatusOK, ""),
		acq(1, "k", "B", 2, 305, 320), // granted after A's release was sent
	}
	if v, _ := CheckHolderWindows(ok, 0.01, int64(2*time.Second)); !v.Valid {
		t.Fatalf("legal history flagged: %+v", v)
	}
	// B acknowledged while A still believed it held the key.
	bad := []Op{
		acq(0, "k", "A", 1, 0, 10),
		acq(1, "k", "B", 2, 500, 510),
	}
	v, ws := CheckHolderWindows(bad, 0.01, int64(2*time.Second))
	if v.Valid || v.Counts["overlaps"] != 1 || len(ws) != 2 {
		t.Fatalf("overlap not caught: %+v %+v", v, ws)
	}
	// A's own deadline (send + TTL*(1-eps)) ends its belief: B after that
	// is fine, and a renewal extends it.
	late := []Op{
		acq(0, "k", "A", 1, 0, 10),
		acq(1, "k", "B", 2, 995, 1000),
	}
	if v, _ := CheckHolderWindows(late, 0.01, int64(2*time.Second)); !v.Valid {
		t.Fatalf("B after A's deadline flagged: %+v", v)
	}
	renewed := []Op{
		acq(0, "k", "A", 1, 0, 10),
		op(0, KRenew, "k", "A", 600, 610, StatusOK, ""),
		acq(1, "k", "B", 2, 995, 1000),
	}
	if v, _ := CheckHolderWindows(renewed, 0.01, int64(2*time.Second)); v.Valid {
		t.Fatal("renewal did not extend the window")
	}
}

func TestFencing(t *testing.T) {
	good := []Op{acq(0, "k", "A", 3, 0, 10), acq(1, "k", "B", 5, 20, 30), acq(2, "k", "C", 4, 5, 40)}
	if v := CheckFencing(good); !v.Valid {
		t.Fatalf("concurrent grants may come in any order: %+v", v)
	}
	bad := []Op{acq(0, "k", "A", 5, 0, 10), acq(1, "k", "B", 4, 20, 30)}
	if v := CheckFencing(bad); v.Valid || v.Counts["violations"] != 1 {
		t.Fatalf("falling token not caught: %+v", v)
	}
	equal := []Op{acq(0, "k", "A", 5, 0, 10), acq(1, "k", "B", 5, 20, 30)}
	if v := CheckFencing(equal); v.Valid {
		t.Fatal("repeated token not caught")
	}
}

func TestCounter(t *testing.T) {
	w := func(val int64, fence uint64, ret int64, st Status) Op {
		o := Op{Kind: KWrite, Key: "c", Value: val, Fence: fence, Return: ret, Status: st, Node: -1}
		if st == StatusFail {
			o.Code = CodeStaleFence
		}
		return o
	}
	good := []Op{w(1, 1, 10, StatusOK), w(2, 2, 20, StatusOK), w(2, 1, 25, StatusFail), w(3, 3, 30, StatusOK)}
	v := CheckCounter(good)
	if !v.Valid || v.Counts["stale-token-rejected"] != 1 || v.Counts["writes-accepted"] != 3 {
		t.Fatalf("good chain: %+v", v)
	}
	lost := []Op{w(1, 1, 10, StatusOK), w(2, 2, 20, StatusOK), w(2, 3, 30, StatusOK)}
	if v := CheckCounter(lost); v.Valid || v.Counts["lost-updates"] != 1 {
		t.Fatalf("lost update not caught: %+v", v)
	}
}

func TestFencedResource(t *testing.T) {
	r := NewFencedResource()
	if !r.admit("k", 5) || !r.admit("k", 5) || r.admit("k", 4) || !r.admit("k", 6) || !r.admit("j", 1) {
		t.Fatal("the resource must admit tokens >= the highest seen per key and refuse lower ones")
	}
}

func TestNoLostAcks(t *testing.T) {
	ops := []Op{
		acq(0, "k", "A", 1, 0, 10),
		op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
		acq(1, "k", "B", 2, 40, 50),
		acq(2, "k", "C", 3, 60, 70),
	}
	state := map[string]struct {
		s string
		f uint64
	}{"A": {"released", 1}, "B": {"active", 2}}
	lookup := func(_ context.Context, id string) (string, uint64, bool, error) {
		st, ok := state[id]
		return st.s, st.f, ok, nil
	}
	v := CheckNoLostAcks(context.Background(), ops, lookup)
	if v.Valid || v.Counts["lost"] != 1 || !strings.Contains(strings.Join(v.Samples, "\n"), "C") {
		t.Fatalf("lost grant of C not caught: %+v", v)
	}
	state["C"] = struct {
		s string
		f uint64
	}{"active", 3}
	state["A"] = struct {
		s string
		f uint64
	}{"active", 1}
	v = CheckNoLostAcks(context.Background(), ops, lookup)
	if v.Valid || v.Counts["lost"] != 1 {
		t.Fatalf("lost release of A not caught: %+v", v)
	}
}

func TestLogs(t *testing.T) {
	if v := CheckLogs(map[string]string{"n0.log": "level=INFO msg=ok\n"}); !v.Valid {
		t.Fatalf("clean log flagged: %+v", v)
	}
	v := CheckLogs(map[string]string{"n0.log": "ok\npanic: runtime error\n", "n1.log": "WARNING: DATA RACE\n"})
	if v.Valid || v.Counts["bad-lines"] != 2 {
		t.Fatalf("bad lines not caught: %+v", v)
	}
}

func TestEffectiveness(t *testing.T) {
	s := &Scenario{Name: "x", Expect: map[string]int{"leader-changes": 1}}
	e := &Env{counts: map[string]int{}}
	if v := checkEffective(s, e, 100, 30); v.Valid {
		t.Fatal("a run without the leader change it needs passed")
	}
	e.Count("leader-changes", 1)
	if v := checkEffective(s, e, 100, 30); !v.Valid {
		t.Fatalf("effective run failed: %+v", v)
	}
	if v := checkEffective(s, e, 10, 30); v.Valid {
		t.Fatal("too few operations before the fault passed")
	}
}

func TestHistoryRoundTrip(t *testing.T) {
	p := filepath.Join(t.TempDir(), "h.jsonl")
	h, err := NewHistory(p)
	if err != nil {
		t.Fatal(err)
	}
	h.Add(acq(h.NewProcess(), "k", "A", 1, 0, 10))
	h.Note(Event{Type: "nemesis", Name: "kill", Phase: "start"})
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	ops, evs, err := ReadHistory(p)
	if err != nil || len(ops) != 1 || len(evs) != 1 || ops[0].LeaseID != "A" || evs[0].Name != "kill" {
		t.Fatalf("round trip: %v %+v %+v", err, ops, evs)
	}
}

func TestClock(t *testing.T) {
	tick := func(k, call, ret int64) Op {
		return Op{Kind: KTick, Value: k, PeriodMS: 100, Call: call * ms, Return: ret * ms, Status: StatusOK, Node: -1}
	}
	// Ten ticks a second, read with some latency: fine.
	good := []Op{tick(10, 0, 5), tick(20, 1000, 1010), tick(31, 2000, 2003), tick(40, 3000, 3020)}
	if v := CheckClock(good, 0.01); !v.Valid || v.Counts["pairs"] == 0 {
		t.Fatalf("a clock at real time flagged: %+v", v)
	}
	// 30 ticks in a second: the clock runs fast.
	fast := []Op{tick(10, 0, 5), tick(40, 1000, 1010)}
	if v := CheckClock(fast, 0.01); v.Valid || v.Counts["violations"] != 1 {
		t.Fatalf("a fast clock passed: %+v", v)
	}
	// Two ticks of slack cover reads that straddle tick boundaries.
	edge := []Op{tick(10, 0, 5), tick(22, 1000, 1001)}
	if v := CheckClock(edge, 0.01); !v.Valid {
		t.Fatalf("two ticks of slack not allowed: %+v", v)
	}
	if v := CheckClock(good[:1], 0.01); v.Valid {
		t.Fatal("a clock checked with one read passed")
	}
}
