package chaos

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/wire"
)

// Contract error codes the lease model reads meaning into.
const (
	codeLeaseHeld     = string(wire.CodeLeaseHeld)
	codeLeaseExpired  = string(wire.CodeLeaseExpired)
	codeLeaseReleased = string(wire.CodeLeaseReleased)
	codeLeaseRevoked  = string(wire.CodeLeaseRevoked)
	codeNotFound      = string(wire.CodeLeaseNotFound)
	codeTokenInvalid  = string(wire.CodeLeaseTokenInvalid)
)

// unknownID stands for a lease granted by an info acquire: nobody learned
// its id, so no client can name it.
const unknownID = "?"

// leaseState is the model's view of one key (limit 1). It is a comparable
// value: porcupine's nondeterministic search deduplicates states with ==.
type leaseState struct {
	Held    bool
	ID      string // unknownID if granted by an info acquire
	TokenFP string
	Fence   uint64 // 0 when unknown
	// Refresh is the call time of the operation that granted or last
	// renewed the lease; TTL its TTL. Both in nanoseconds.
	Refresh int64
	TTL     int64
	// MaxFence is the highest fencing token granted on the key so far.
	MaxFence uint64
}

func (s leaseState) free() leaseState {
	return leaseState{MaxFence: s.MaxFence}
}

// LeaseModel is the porcupine model of one lease key with TTL expiry.
//
// Expiry is a silent transition the model allows only once it is certain to
// be legitimate: an operation that observes the lease gone (another grant, a
// read of a free key, LEASE_EXPIRED) at return time r is legal only if
// r >= refresh + TTL*(1-eps), where refresh is the send time of the grant or
// renewal. The server may expire later than that (ticks lag real time; a
// stalled cluster stops the clock), never earlier, so the check gives no
// false alarm on a legitimate expiry. eps covers clock-rate differences
// between the harness and the leader (0.01 on one machine without clock
// faults).
//
// Info operations (timeouts, cut connections, INDETERMINATE) fork the
// model: applied or not, at any time after their call. Their return is at
// infinity, and their process never issues another operation.
func LeaseModel(eps float64) porcupine.Model {
	if eps < 0 || eps >= 1 {
		panic(fmt.Sprintf("chaos: eps %v outside [0, 1)", eps))
	}
	nm := porcupine.NondeterministicModel{
		Partition: partitionByKey,
		Init:      func() []interface{} { return []interface{}{leaseState{}} },
		Step: func(state, input, _ interface{}) []interface{} {
			return stepLease(state.(leaseState), input.(Op), eps)
		},
		Equal: func(a, b interface{}) bool { return a.(leaseState) == b.(leaseState) },
		DescribeOperation: func(input, _ interface{}) string {
			return describeOp(input.(Op))
		},
		DescribeState: func(state interface{}) string {
			s := state.(leaseState)
			if !s.Held {
				return fmt.Sprintf("free (max fence %d)", s.MaxFence)
			}
			return fmt.Sprintf("held by %s fence %d until >= %.3fs (max fence %d)",
				s.ID, s.Fence, float64(s.Refresh+s.TTL)/1e9, s.MaxFence)
		},
	}
	return nm.ToModel()
}

func stepLease(s leaseState, op Op, eps float64) []interface{} {
	// allowed reports whether the current lease may have expired by the
	// return of op.
	allowed := func() bool {
		if !s.Held {
			return true
		}
		if op.Status == StatusInfo {
			return true
		}
		return op.Return >= s.Refresh+int64(float64(s.TTL)*(1-eps))
	}
	ttl := op.TTLMS * 1e6
	current := s.Held && s.ID == op.LeaseID
	rightToken := current && !op.Stale && (s.TokenFP == "" || s.TokenFP == op.TokenFP)

	switch op.Kind {
	case KRestore:
		return stepRestore(s, op, allowed)
	case KAcquire:
		return stepAcquire(s, op, ttl, allowed)
	case KRenew:
		return stepRenew(s, op, ttl, current, rightToken, allowed)
	case KRelease:
		return stepRelease(s, op, current, rightToken, allowed)
	case KRead:
		return stepRead(s, op, allowed)
	}
	return oneState(s)
}

// oneState is the single state a step leads to.
func oneState(ns leaseState) []interface{} { return []interface{}{ns} }

// stepAcquire is an acquire of the key, with a TTL of ttl ns.
func stepAcquire(s leaseState, op Op, ttl int64, allowed func() bool) []interface{} {
	switch op.Status {
	case StatusOK:
		if !allowed() || op.Fence <= s.MaxFence {
			return nil
		}
		return oneState(leaseState{Held: true, ID: op.LeaseID, TokenFP: op.TokenFP, Fence: op.Fence,
			Refresh: op.Call, TTL: ttl, MaxFence: op.Fence})
	case StatusFail:
		if op.Code == codeLeaseHeld && !s.Held {
			return nil // a lost release or expiry-free key refused
		}
		return oneState(s)
	default:
		return []interface{}{s, leaseState{Held: true, ID: unknownID, Refresh: op.Call, TTL: ttl, MaxFence: s.MaxFence}}
	}
}

// stepRenew is a renewal of op.LeaseID, with a TTL of ttl ns.
func stepRenew(s leaseState, op Op, ttl int64, current, rightToken bool, allowed func() bool) []interface{} {
	switch op.Status {
	case StatusOK:
		if !rightToken {
			return nil
		}
		ns := s
		ns.Refresh, ns.TTL = op.Call, ttl
		return oneState(ns)
	case StatusFail:
		return failOnCurrent(s, op, current, rightToken, allowed)
	default:
		if rightToken {
			ns := s
			ns.Refresh, ns.TTL = op.Call, ttl
			return []interface{}{s, ns}
		}
		return oneState(s)
	}
}

// stepRelease is a release of op.LeaseID.
func stepRelease(s leaseState, op Op, current, rightToken bool, allowed func() bool) []interface{} {
	switch op.Status {
	case StatusOK:
		if !rightToken {
			return nil
		}
		return oneState(s.free())
	case StatusFail:
		return failOnCurrent(s, op, current, rightToken, allowed)
	default:
		if rightToken {
			return []interface{}{s, s.free()}
		}
		return oneState(s)
	}
}

// stepRead is a read of the key: its lease (op.LeaseID, op.Fence), or
// none.
func stepRead(s leaseState, op Op, allowed func() bool) []interface{} {
	if op.Status != StatusOK {
		return oneState(s)
	}
	if op.LeaseID == "" {
		if !allowed() {
			return nil
		}
		return oneState(s.free())
	}
	if !s.Held {
		return nil
	}
	if s.ID == unknownID {
		ns := s
		ns.ID = op.LeaseID
		if op.Fence != 0 {
			if op.Fence <= s.MaxFence {
				return nil
			}
			ns.Fence, ns.MaxFence = op.Fence, op.Fence
		}
		return oneState(ns)
	}
	if s.ID != op.LeaseID || (op.Fence != 0 && s.Fence != 0 && op.Fence != s.Fence) {
		return nil
	}
	if s.Fence == 0 && op.Fence != 0 {
		// A lease a restore brought back: its new token is above
		// every token granted before.
		if op.Fence <= s.MaxFence {
			return nil
		}
		ns := s
		ns.Fence, ns.MaxFence = op.Fence, op.Fence
		return oneState(ns)
	}
	return oneState(s)
}

// stepRestore is a restore as seen from one key whose lease in the file
// is op.LeaseID. A lease live at the restore is kept as it is (s); a free
// key gets the file's lease back, with a new fencing token (unknown here,
// above every token before the restore) and a remaining time the model
// does not know (so it may end at any time: TTL 0). The key may be free at
// the restore once the current lease may have expired.
func stepRestore(s leaseState, op Op, allowed func() bool) []interface{} {
	back := leaseState{Held: true, ID: op.LeaseID, Refresh: op.Call, MaxFence: s.MaxFence}
	switch {
	case op.Status == StatusFail:
		return []interface{}{s}
	case !s.Held && op.Status == StatusOK:
		return []interface{}{back}
	case !s.Held || allowed():
		return []interface{}{s, back}
	}
	return []interface{}{s}
}

// failOnCurrent is a renew or release that definitely failed.
func failOnCurrent(s leaseState, op Op, current, rightToken bool, allowed func() bool) []interface{} {
	if !current {
		return []interface{}{s}
	}
	switch op.Code {
	case codeLeaseExpired:
		if !allowed() {
			return nil // expired early
		}
		return []interface{}{s.free()}
	case codeLeaseReleased, codeLeaseRevoked, codeNotFound:
		return nil // the workload never revokes; the lease is current
	case codeTokenInvalid:
		if rightToken {
			return nil
		}
	}
	return []interface{}{s}
}

// partitionByKey checks each key on its own: keys are independent.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, o := range history {
		k := o.Input.(Op).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], o)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

func describeOp(op Op) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", op.Kind)
	switch op.Kind {
	case KAcquire:
		fmt.Fprintf(&b, " %s ttl=%dms", op.Holder, op.TTLMS)
	case KRestore:
		fmt.Fprintf(&b, " (the file has %s)", op.LeaseID)
	case KRenew, KRelease:
		fmt.Fprintf(&b, " %s", op.LeaseID)
		if op.Stale {
			b.WriteString(" (stale token)")
		}
	}
	switch op.Status {
	case StatusOK:
		switch op.Kind {
		case KAcquire:
			fmt.Fprintf(&b, " -> %s fence %d", op.LeaseID, op.Fence)
		case KRead:
			if op.LeaseID == "" {
				b.WriteString(" -> free")
			} else {
				fmt.Fprintf(&b, " -> %s fence %d", op.LeaseID, op.Fence)
			}
		default:
			b.WriteString(" -> ok")
		}
	case StatusFail:
		fmt.Fprintf(&b, " -> %s", orDefault(op.Code, op.Err))
	default:
		fmt.Fprintf(&b, " -> ? (%s)", orDefault(op.Code, op.Err))
	}
	fmt.Fprintf(&b, " @node%d", op.Node)
	return b.String()
}

func orDefault(s, d string) string {
	if s != "" {
		return s
	}
	return d
}

// porcupineOps turns the lease operations of a history into porcupine's
// form. Info operations return at infinity; failed and info reads, which
// have no effect, are left out. A restore becomes one operation per key the
// file has a lease on (a key without one is not changed by the restore:
// free stays free, a live lease is kept).
func porcupineOps(ops []Op) []porcupine.Operation {
	var out []porcupine.Operation
	for _, op := range ops {
		switch op.Kind {
		case KRestore:
			if op.Status == StatusFail {
				continue
			}
			ret := op.Return
			if op.Status == StatusInfo {
				ret = math.MaxInt64 / 2
			}
			keys := make([]string, 0, len(op.Restored))
			for k := range op.Restored {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				o := op
				o.Key, o.LeaseID, o.Restored = k, op.Restored[k], nil
				out = append(out, porcupine.Operation{ClientId: op.Process, Input: o, Call: o.Call, Output: o, Return: ret})
			}
			continue
		case KAcquire, KRenew, KRelease:
		case KRead:
			if op.Status != StatusOK {
				continue
			}
		default:
			continue
		}
		ret := op.Return
		if op.Status == StatusInfo {
			ret = math.MaxInt64 / 2
		}
		out = append(out, porcupine.Operation{ClientId: op.Process, Input: op, Call: op.Call, Output: op, Return: ret})
	}
	return out
}
