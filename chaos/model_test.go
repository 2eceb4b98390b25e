package chaos

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

const ms = int64(time.Millisecond)

func acq(proc int, key, id string, fence uint64, call, ret int64) Op {
	return Op{Process: proc, Kind: KAcquire, Key: key, Holder: "h", LeaseID: id, TokenFP: "t" + id,
		TTLMS: 1000, Fence: fence, Call: call * ms, Return: ret * ms, Status: StatusOK}
}

func held(proc int, key string, call, ret int64) Op {
	return Op{Process: proc, Kind: KAcquire, Key: key, Holder: "h", TTLMS: 1000, Call: call * ms, Return: ret * ms,
		Status: StatusFail, Code: codeLeaseHeld}
}

func op(proc int, kind Kind, key, id string, call, ret int64, st Status, code string) Op {
	return Op{Process: proc, Kind: kind, Key: key, LeaseID: id, TokenFP: "t" + id, TTLMS: 1000,
		Call: call * ms, Return: ret * ms, Status: st, Code: code}
}

func read(proc int, key, id string, fence uint64, call, ret int64) Op {
	return Op{Process: proc, Kind: KRead, Key: key, LeaseID: id, Fence: fence, Call: call * ms, Return: ret * ms, Status: StatusOK}
}

func restore(proc int, restored map[string]string, call, ret int64) Op {
	return Op{Process: proc, Kind: KRestore, Restored: restored, Call: call * ms, Return: ret * ms, Status: StatusOK}
}

func TestLeaseModel(t *testing.T) {
	cases := []struct {
		name string
		ops  []Op
		want porcupine.CheckResult
	}{
		{"acquire renew release reacquire", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRenew, "k", "A", 500, 510, StatusOK, ""),
			op(0, KRelease, "k", "A", 900, 910, StatusOK, ""),
			acq(1, "k", "B", 2, 920, 930),
			read(2, "k", "B", 2, 940, 950),
		}, porcupine.Ok},
		{"double grant", []Op{
			acq(0, "k", "A", 1, 0, 10),
			acq(1, "k", "B", 2, 100, 110),
		}, porcupine.Illegal},
		{"expiry after TTL is legitimate", []Op{
			acq(0, "k", "A", 1, 0, 10),
			held(1, "k", 500, 510),
			acq(1, "k", "B", 2, 1000, 1010),
		}, porcupine.Ok},
		{"late expiry is legitimate", []Op{
			acq(0, "k", "A", 1, 0, 10),
			held(1, "k", 2500, 2510),
			read(2, "k", "A", 1, 2600, 2610),
		}, porcupine.Ok},
		{"early expiry seen by a grant", []Op{
			acq(0, "k", "A", 1, 0, 10),
			acq(1, "k", "B", 2, 950, 960),
		}, porcupine.Illegal},
		{"early expiry seen by a read", []Op{
			acq(0, "k", "A", 1, 0, 10),
			read(1, "k", "", 0, 900, 910),
		}, porcupine.Illegal},
		{"early expiry reported to the holder", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRenew, "k", "A", 800, 810, StatusFail, codeLeaseExpired),
		}, porcupine.Illegal},
		{"renewal moves expiry", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRenew, "k", "A", 800, 810, StatusOK, ""),
			acq(1, "k", "B", 2, 1200, 1210),
		}, porcupine.Illegal},
		{"falling fencing token", []Op{
			acq(0, "k", "A", 5, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			acq(1, "k", "B", 4, 40, 50),
		}, porcupine.Illegal},
		{"lost release", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			held(1, "k", 40, 50),
		}, porcupine.Illegal},
		{"stale read after release", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			read(1, "k", "A", 1, 40, 50),
		}, porcupine.Illegal},
		{"renew with a stale token accepted", []Op{
			acq(0, "k", "A", 1, 0, 10),
			func() Op { o := op(1, KRenew, "k", "A", 20, 30, StatusOK, ""); o.Stale = true; return o }(),
		}, porcupine.Illegal},
		{"renew with a stale token refused", []Op{
			acq(0, "k", "A", 1, 0, 10),
			func() Op {
				o := op(1, KRenew, "k", "A", 20, 30, StatusFail, codeTokenInvalid)
				o.Stale = true
				return o
			}(),
			held(2, "k", 40, 50),
		}, porcupine.Ok},
		{"info acquire may have applied", []Op{
			{Process: 0, Kind: KAcquire, Key: "k", TTLMS: 1000, Call: 0, Return: 10 * ms, Status: StatusInfo},
			held(1, "k", 100, 110),
			read(2, "k", "X", 7, 200, 210),
			acq(1, "k", "B", 8, 1300, 1310),
		}, porcupine.Ok},
		{"info acquire may not have applied", []Op{
			{Process: 0, Kind: KAcquire, Key: "k", TTLMS: 1000, Call: 0, Return: 10 * ms, Status: StatusInfo},
			acq(1, "k", "B", 2, 100, 110),
		}, porcupine.Ok},
		{"info release may have applied", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusInfo, ""),
			acq(1, "k", "B", 2, 40, 50),
		}, porcupine.Ok},
		{"keys are independent", []Op{
			acq(0, "k1", "A", 1, 0, 10),
			acq(1, "k2", "B", 2, 5, 15),
		}, porcupine.Ok},
		// A restore of a file in which A holds k.
		{"restore keeps the live lease", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			acq(1, "k", "B", 2, 40, 50),
			restore(9, map[string]string{"k": "A"}, 100, 110),
			held(2, "k", 120, 130),
			op(1, KRenew, "k", "B", 140, 150, StatusOK, ""),
		}, porcupine.Ok},
		{"restore brings the old holder back over a live lease", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			acq(1, "k", "B", 2, 40, 50),
			restore(9, map[string]string{"k": "A"}, 100, 110),
			read(2, "k", "A", 3, 120, 130),
		}, porcupine.Illegal},
		{"restore lets a third client in while the holder is live", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			acq(1, "k", "B", 2, 40, 50),
			restore(9, map[string]string{"k": "A"}, 100, 110),
			acq(2, "k", "C", 3, 120, 130),
		}, porcupine.Illegal},
		{"restore brings the file's lease back on a free key, re-fenced", []Op{
			acq(0, "k", "A", 1, 0, 10),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			restore(9, map[string]string{"k": "A"}, 100, 110),
			read(2, "k", "A", 7, 120, 130),
			held(2, "k", 140, 150),
			op(0, KRenew, "k", "A", 160, 170, StatusOK, ""),
			acq(1, "k", "C", 8, 1200, 1210),
		}, porcupine.Ok},
		{"a lease brought back keeps its old token", []Op{
			acq(0, "k", "A", 1, 0, 10),
			acq(1, "k2", "X", 5, 15, 18),
			op(0, KRelease, "k", "A", 20, 30, StatusOK, ""),
			restore(9, map[string]string{"k": "A"}, 100, 110),
			read(2, "k", "A", 1, 120, 130),
		}, porcupine.Illegal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := porcupine.CheckOperationsTimeout(LeaseModel(0.01), porcupineOps(tc.ops), 10*time.Second)
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}
