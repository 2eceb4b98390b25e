package fsm

import (
	"cmp"
	"slices"
	"strings"

	"github.com/leasehold/leasehold/wire"
)

// leaseBook owns the leases and the keys: the lease records, each key's
// state (active ids, lock-delay, queued acquires, stolen slots), the
// idempotency map, the holder and listing indexes. It acquires, renews,
// releases, revokes and ends leases, grants queued acquires (pump), and
// asks the other parts for sessions (sess), timers (exp) and lease groups
// (grp).
type leaseBook struct {
	*core
	sess *sessionBook
	exp  *expiry
	grp  *groupBook

	leases table[*Lease]
	keys   table[*keyState]
	idem   map[Hash]string // idempotency hash -> lease id (granted or queued)
	// waiting is each queued lease id's key; holderWaits each holder's
	// queued acquires: lease id -> key.
	waiting     map[string]string
	holderWaits map[string]map[string]string
	order       idIndex  // lease ids, for ordered listing
	keyIdx      keyIndex // keys of lease records (any state), counted, so that a prefix listing seeks
	holders     map[string]*holderIndex
	active      int // active leases
	// canaryReleased is canary_fence_repeat's: key -> the token of its
	// last released lease (nil in every normal build).
	canaryReleased map[string]uint64
}

func validateAcquire(c *Acquire) *wire.Error {
	if err := validID("lease_id", c.LeaseID); err != nil {
		return err
	}
	if err := ValidKey(c.Key); err != nil {
		return err
	}
	if c.SessionID == "" || c.Holder != "" {
		if err := ValidHolder(c.Holder); err != nil {
			return err
		}
	}
	if c.Limit < 1 || c.Limit > MaxLimit {
		return wire.OutOfRange("limit", 1, MaxLimit, int64(c.Limit), "")
	}
	if c.SessionID == "" && c.TTLTicks == 0 {
		return InvalidField("ttl_ms", "a standalone lease needs a ttl")
	}
	if c.SessionID != "" && c.TTLTicks != 0 {
		return InvalidField("ttl_ms", "a lease bound to a session takes the session's ttl")
	}
	if c.TokenHash.IsZero() {
		return InvalidField("token", "missing token hash")
	}
	if c.TTLTicks > MaxTicks || c.WaitTicks > MaxTicks || c.LockDelayTicks > MaxTicks {
		return InvalidField("ttl_ms", "durations are limited to %d ticks", uint64(MaxTicks))
	}
	return ValidMetadata(c.Metadata)
}

func (lb *leaseBook) acquire(c *Acquire) Result {
	if err := validateAcquire(c); err != nil {
		return Result{Err: err}
	}
	if id, ok := lb.idemLease(c.IdemHash); ok {
		return lb.replay(id, c)
	}
	if err := lb.idTaken(c.LeaseID); err != nil {
		return Result{Err: err}
	}
	sess, holder, err := lb.sess.bind(c.SessionID, c.SessionTokenHash, c.Holder)
	if err != nil {
		return Result{Err: err}
	}
	if err := lb.checkLeaseQuota(c.Quota, holder, 1, false); err != nil {
		return Result{Err: err}
	}
	if err := lb.limitMismatch(c.Key, c.Limit); err != nil {
		return Result{Err: err}
	}
	ks := lb.keyFor(c)
	if ks.free() > 0 && ks.nWaiters() == 0 {
		l := lb.grant(c, ks, sess, "")
		return Result{Lease: l}
	}
	if c.WaitTicks > 0 {
		if err := lb.checkWaitQuota(c.Quota, holder, []string{c.Key}, false); err != nil {
			lb.dropKey(c.Key, ks)
			return Result{Err: err}
		}
		q := c
		if c.Holder != holder {
			// A bound acquire names its holder through its session; the
			// queued copy names it itself, so that the holder's waiters
			// are counted alike on every replica, before and after a
			// snapshot, even once the session's record is gone.
			cc := *c
			cc.Holder = holder
			q = &cc
		}
		lb.queueWaiter(ks, waiter{Cmd: q, Deadline: lb.tick + c.WaitTicks})
		lb.rememberIdem(c.IdemHash, c.LeaseID)
		return Result{Queued: true, Lease: &Lease{ID: c.LeaseID, Key: c.Key, Holder: c.Holder, idem: newLeaseIdem(Hash{}, Hash{}, c.SealedToken)}}
	}
	err = lb.busyError(c.Key, ks)
	lb.dropKey(c.Key, ks)
	return Result{Err: err}
}

// checkLeaseQuota refuses n new leases (granted or queued) of holder, one
// or a lease group's members, when the cluster's live leases (active and
// queued) or the holder's active leases would pass their limit. An
// idempotent replay is answered before this check.
func (lb *leaseBook) checkLeaseQuota(q Quota, holder string, n int, group bool) *wire.Error {
	over := "its limit"
	if group {
		over = "a lease group of " + itoa(uint64(n)) + " would pass its limit"
	}
	if live := uint64(lb.active + len(lb.waiting)); q.Leases > 0 && live+uint64(n) > q.Leases {
		return Exhausted("leases", q.Leases, "the cluster has %d live leases (active or queued), %s", live, over)
	}
	have := 0
	if hi := lb.holders[holder]; hi != nil {
		have = hi.leases.n
	}
	if q.HolderLeases > 0 && uint64(have+n) > q.HolderLeases {
		return Exhausted("leases_per_holder", q.HolderLeases, "holder %s has %d active leases, %s", quote(holder), have, over)
	}
	return nil
}

// checkWaitQuota refuses to queue acquires of holder on keys (one, or a
// lease group's) when a key's queue is at its limit or the holder's
// queued acquires would pass theirs.
func (lb *leaseBook) checkWaitQuota(q Quota, holder string, keys []string, group bool) *wire.Error {
	for _, k := range keys {
		if ks := lb.keys.Get(k); ks != nil {
			if n := uint64(ks.nWaiters()); q.KeyWaiters > 0 && n >= q.KeyWaiters {
				return Exhausted("waiters_per_key", q.KeyWaiters, "key %s has %d queued acquires, its limit", quote(k), n)
			}
		}
	}
	over := "its limit"
	if group {
		over = "a lease group of " + itoa(uint64(len(keys))) + " would pass its limit"
	}
	if n := uint64(len(lb.holderWaits[holder])); q.HolderWaiters > 0 && n+uint64(len(keys)) > q.HolderWaiters {
		return Exhausted("waiters_per_holder", q.HolderWaiters, "holder %s has %d queued acquires, %s", quote(holder), n, over)
	}
	return nil
}

// idemLease is the lease (granted or queued) an idempotency hash names.
func (lb *leaseBook) idemLease(h Hash) (string, bool) {
	if h.IsZero() {
		return "", false
	}
	id, ok := lb.idem[h]
	return id, ok
}

// rememberIdem records that idempotency hash h (if set) names lease id.
func (lb *leaseBook) rememberIdem(h Hash, id string) {
	if !h.IsZero() {
		lb.idem[h] = id
	}
}

// idTaken refuses a lease id that a lease record or a queued acquire has.
func (lb *leaseBook) idTaken(id string) *wire.Error {
	if lb.leases.Has(id) || lb.waiting[id] != "" {
		return InvalidField("lease_id", "lease id %s already exists", id)
	}
	return nil
}

// limitMismatch refuses limit on key when the key is in use with another.
func (lb *leaseBook) limitMismatch(key string, limit uint32) *wire.Error {
	ks := lb.keys.Get(key)
	if ks == nil || !ks.inUse() || ks.limit == limit {
		return nil
	}
	return &wire.Error{Code: wire.CodeLimitMismatch, Key: key,
		Message: "key " + quote(key) + " is in use with limit " + itoa(uint64(ks.limit)) + ", not " + itoa(uint64(limit))}
}

// keyFor returns the state of a's key, made if need be, with a's limit if
// the key is not in use.
func (lb *leaseBook) keyFor(a *Acquire) *keyState {
	ks := lb.keys.Get(a.Key)
	if ks == nil {
		ks = &keyState{key: a.Key}
		lb.keys.Put(ks)
	}
	if !ks.inUse() {
		ks.limit = a.Limit
	}
	return ks
}

// queueWaiter appends w to the queue of its key and sets its deadline's
// timer.
func (lb *leaseBook) queueWaiter(ks *keyState, w waiter) {
	c := w.Cmd
	ks.ext().waitq.push(w)
	lb.waiting[c.LeaseID] = c.Key
	hw := lb.holderWaits[c.Holder]
	if hw == nil {
		hw = make(map[string]string)
		lb.holderWaits[c.Holder] = hw
	}
	hw[c.LeaseID] = c.Key
	lb.exp.schedule(w.Deadline, kindWait, c.Key+"\x00"+c.LeaseID)
}

// unqueue withdraws the queued acquire id from the queue of ks and from the
// indexes (not from the idempotency map). It does not tidy the key.
func (lb *leaseBook) unqueue(ks *keyState, id string) (waiter, bool) {
	if ks == nil || ks.more == nil {
		return waiter{}, false
	}
	w, ok := ks.more.waitq.remove(id)
	if !ok {
		return waiter{}, false
	}
	delete(lb.waiting, id)
	if hw := lb.holderWaits[w.Cmd.Holder]; hw != nil {
		delete(hw, id)
		if len(hw) == 0 {
			delete(lb.holderWaits, w.Cmd.Holder)
		}
	}
	return w, true
}

// busyError explains why no slot is free: LOCK_DELAY when a blocked slot is
// what stands in the way, LEASE_HELD otherwise.
func (lb *leaseBook) busyError(key string, ks *keyState) *wire.Error {
	if len(ks.blocked()) > 0 && len(ks.active()) < int(ks.limit) {
		until := ks.blocked()[0].Until
		for _, b := range ks.blocked() {
			until = min(until, b.Until)
		}
		return &wire.Error{Code: wire.CodeLockDelay, Key: key, RemainingMS: lb.remainingMS(until),
			Message: "key " + quote(key) + " is in lock-delay after its last holder's lease ended involuntarily"}
	}
	holders := make([]wire.HolderInfo, 0, len(ks.active()))
	for _, id := range ks.active() {
		l := lb.leases.Get(id)
		holders = append(holders, wire.HolderInfo{Holder: l.Holder, LeaseID: l.ID, RemainingMS: lb.remainingMS(lb.sess.leaseEnd(l))})
	}
	msg := "key " + quote(key) + " is held"
	if n := ks.nWaiters(); n > 0 && ks.free() > 0 {
		// A lease group at the head of the queue waits for its other
		// keys: the free slots are kept for the queue (group.go).
		msg = "key " + quote(key) + " has " + itoa(uint64(n)) + " acquires queued ahead, the first of them a lease group waiting for its other keys"
	} else if n > 0 {
		msg += " and " + itoa(uint64(n)) + " acquires are queued for it"
	}
	return &wire.Error{Code: wire.CodeLeaseHeld, Key: key, Holders: holders, Message: msg}
}

// idemConflict refuses an idempotency key that named another request.
func idemConflict(id string) Result {
	return Result{Err: Errorf(wire.CodeIdempotencyConflict, "idempotency key was used for a different request (lease %s)", id)}
}

func (lb *leaseBook) replay(id string, c *Acquire) Result {
	if l := lb.leases.Get(id); l != nil {
		if l.fingerprint() != c.Fingerprint || l.GroupID() != "" {
			return idemConflict(id)
		}
		return Result{Lease: l, Replayed: true}
	}
	if w, ok := lb.findWaiter(c.Key, id); ok {
		if w.Cmd.Fingerprint != c.Fingerprint || w.group != "" {
			return idemConflict(id)
		}
		return Result{Queued: true, Replayed: true, Lease: &Lease{ID: id, Key: w.Cmd.Key, Holder: c.Holder, idem: newLeaseIdem(Hash{}, Hash{}, w.Cmd.SealedToken)}}
	}
	// The key differs from the queued request's: a different request.
	return idemConflict(id)
}

// findWaiter returns the queued acquire id on key.
func (lb *leaseBook) findWaiter(key, id string) (waiter, bool) {
	ks := lb.keys.Get(key)
	if ks == nil || ks.more == nil {
		return waiter{}, false
	}
	return ks.more.waitq.find(id)
}

// grant makes c's lease, a member of lease group group if not "".
// c was validated (validateAcquire; a restored waiter by checkWaiters):
// its Limit is at most MaxLimit.
func (lb *leaseBook) grant(c *Acquire, ks *keyState, sess *Session, group string) *Lease {
	l := &Lease{
		ID: c.LeaseID, Key: c.Key, Holder: c.Holder, Limit: uint16(c.Limit), State: StateActive,
		Fence: lb.nextFence(), TokenHash: c.TokenHash, TTLMS: c.TTLMS, TTLTicks: c.TTLTicks,
		AcquiredTick: lb.tick, AcquiredWallMS: c.WallMS, cold: newLeaseCold(c.Metadata, c.LockDelayTicks),
		idem: withGroup(newLeaseIdem(c.IdemHash, c.Fingerprint, c.SealedToken), group),
	}
	if canaryFenceRepeat && lb.canaryReleased[c.Key] != 0 {
		l.Fence = lb.canaryReleased[c.Key]
		delete(lb.canaryReleased, c.Key)
	}
	if canaryWallApply {
		l.AcquiredWallMS = canaryWallMS()
	}
	if sess != nil {
		l.SessionID = sess.ID
		l.Holder = sess.Holder
		l.TTLMS, l.TTLTicks = 0, 0
		lb.sess.bindLease(sess, l.ID)
	} else {
		l.ExpiresTick = lb.tick + c.TTLTicks
		lb.exp.schedule(leaseDeadline(l), kindLease, l.ID)
	}
	hi := lb.holder(l.Holder)
	l.Holder = hi.name // one string per holder, not one per lease
	hi.leases.insert(l.ID)
	lb.leases.Put(l)
	lb.order.insert(l.ID)
	lb.keyIdx.add(l.Key)
	lb.active++
	ks.addActive(l.ID)
	lb.rememberIdem(c.IdemHash, l.ID)
	var prev string
	if len(ks.stolen()) > 0 {
		prev = ks.stolen()[0]
		ks.more.stolen[0] = ""
		ks.more.stolen = ks.more.stolen[1:]
		ks.tidy()
	}
	lb.emit(Event{Type: EventAcquired, WallMS: c.WallMS, Key: l.Key, Lease: l, Previous: prev})
	return l
}

// endOpts says how a lease ends.
type endOpts struct {
	state  State
	reason string
	wallMS int64
	delay  bool // apply the lease's lock-delay and remember it as stolen
	// midTick: the end is applied between two ticks (a revoke), not by a
	// tick; its lock-delay counts from the next tick boundary.
	midTick bool
	session bool // ended with its session: the session record keeps the id
}

// withoutID returns ids without id (which it holds at most once) and
// leaves ids as it was: older versions of a session, which events and
// answers may still hold, share its array. The first or the last id goes
// without a copy (a session's leases released in the order they were
// granted, or the reverse), so that releasing all n leases of a session is
// not O(n²); another is removed from a copy.
func withoutID(ids []string, id string) []string {
	switch n := len(ids); {
	case n > 0 && ids[0] == id:
		// Appending to the rest writes past the end of every older
		// version, as a grant's append always does.
		return ids[1:]
	case n > 0 && ids[n-1] == id:
		// No room left: the next append copies instead of overwriting
		// the id that older versions still read there.
		return ids[: n-1 : n-1]
	}
	i := slices.Index(ids, id)
	if i < 0 {
		return ids
	}
	out := make([]string, 0, len(ids)-1)
	return append(append(out, ids[:i]...), ids[i+1:]...)
}

// end moves an active lease to a terminal state and frees its slot.
func (lb *leaseBook) end(l *Lease, o endOpts) *Lease {
	nl := l.endedCopy(o.state, o.reason, lb.tick, o.wallMS)
	lb.leases.Put(nl)
	lb.active--
	ks := lb.keys.Get(l.Key)
	lb.removeActive(ks, l)
	if hi := lb.holders[l.Holder]; hi != nil {
		hi.leases.remove(l.ID)
		lb.dropHolder(l.Holder)
	}
	if l.SessionID != "" && !o.session {
		lb.sess.unbindLease(l.SessionID, l.ID)
	}
	lb.exp.ended(kindLease, l.ID)
	if o.delay {
		ks.addStolen(l.ID)
		if d := l.LockDelayTicks(); d > 0 {
			until := lb.tick + d
			if o.midTick {
				// The next tick may commit right after this entry, and
				// one tick may follow another at once after a stall:
				// counting from the next boundary keeps the slot
				// blocked for the whole delay after the revoke is
				// acknowledged (DESIGN.md).
				until++
			}
			ks.ext().blocked = append(ks.blocked(), blocked{Until: until, LeaseID: l.ID})
			lb.exp.schedule(until, kindDelay, l.Key)
		}
	}
	typ := EventReleased
	switch o.state {
	case StateExpired:
		typ = EventExpired
	case StateRevoked:
		typ = EventRevoked
	}
	lb.emit(Event{Type: typ, WallMS: o.wallMS, Key: l.Key, Lease: nl, Reason: o.reason})
	lb.pump(l.Key, ks)
	return nl
}

// removeActive takes l out of the active ids of its key. They are in fence
// order, so a long list (a semaphore's) is searched by fence rather than
// scanned.
func (lb *leaseBook) removeActive(ks *keyState, l *Lease) {
	a := ks.active()
	i := -1
	if len(a) > 16 {
		j, _ := slices.BinarySearchFunc(a, l.Fence, func(id string, fence uint64) int {
			return cmp.Compare(lb.leases.Get(id).Fence, fence)
		})
		if j < len(a) && a[j] == l.ID {
			i = j
		}
	}
	if i < 0 {
		if i = slices.Index(a, l.ID); i < 0 {
			return
		}
	}
	ks.removeActiveAt(i)
}

// pump grants queued acquires on key while slots are free, then forgets the
// key if nothing refers to it any more.
func (lb *leaseBook) pump(key string, ks *keyState) {
	for ks.free() > 0 && ks.nWaiters() > 0 {
		w := ks.more.waitq.front()
		if w.group != "" {
			// A lease group: granted only at the head of every one of
			// its keys' queues, and until then it holds this queue up.
			if !lb.grp.pumpGroup(w.group) {
				break
			}
			continue
		}
		lb.unqueue(ks, w.Cmd.LeaseID)
		c := w.Cmd
		sess, err := lb.stillGrantable(c, c.LeaseID)
		if err != nil {
			lb.dropWaiter(c, c.LeaseID, err)
			continue
		}
		l := lb.grant(c, ks, sess, "")
		lb.notices = append(lb.notices, Notice{LeaseID: c.LeaseID, Lease: l})
	}
	lb.dropKey(key, ks)
	lb.grp.repumpKeys()
}

// stillGrantable checks that queued acquire c (of a lease group: its
// first member, ids being the group's lease ids) can still be granted now
// that it leaves its queues, and returns its session: no lease took one of
// its ids meanwhile (acquire only sees waiters on its own key, so an id may
// have been granted on another key: never grant it twice), and its
// session, if any, is still active.
func (lb *leaseBook) stillGrantable(c *Acquire, ids ...string) (*Session, *wire.Error) {
	for _, id := range ids {
		if lb.leases.Has(id) {
			return nil, InvalidField("lease_id", "lease id %s already exists", id)
		}
	}
	if c.SessionID == "" {
		return nil, nil
	}
	return lb.sess.checkSession(c.SessionID, c.SessionTokenHash)
}

// dropWaiter forgets the idempotency record of withdrawn queued acquire c
// (a lease group's first member) and tells its proposer err under name
// (its lease id or its group's); nil: nobody listens any more.
func (lb *leaseBook) dropWaiter(c *Acquire, name string, err *wire.Error) {
	lb.forgetIdem(c.IdemHash, c.LeaseID)
	if err != nil {
		lb.notices = append(lb.notices, Notice{LeaseID: name, Err: err})
	}
}

func (lb *leaseBook) forgetIdem(h Hash, id string) {
	if !h.IsZero() && lb.idem[h] == id {
		delete(lb.idem, h)
	}
}

func (lb *leaseBook) dropKey(key string, ks *keyState) {
	ks.tidy()
	if !ks.inUse() && len(ks.stolen()) == 0 {
		lb.keys.Delete(key)
	}
}

// checkLease finds an active lease and checks its token. A bound lease may
// also be authenticated by its session's token when sessTok is set.
func (lb *leaseBook) checkLease(id string, tok, sessTok Hash) (*Lease, *wire.Error) {
	if err := validID("lease_id", id); err != nil {
		return nil, err
	}
	l := lb.leases.Get(id)
	if l == nil {
		return nil, Errorf(wire.CodeLeaseNotFound, "lease %s not found", id)
	}
	ok := !tok.IsZero() && tok == l.TokenHash
	if !ok && !sessTok.IsZero() && l.SessionID != "" {
		if s := lb.sess.Session(l.SessionID); s != nil && s.TokenHash == sessTok {
			ok = true
		}
	}
	if !ok {
		return nil, Errorf(wire.CodeLeaseTokenInvalid, "token does not match lease %s", id)
	}
	if l.Terminal() {
		return nil, terminalError(l)
	}
	if lb.exp.leaseDue(l) {
		// Its expiry is in the backlog (expire.go): it has expired as
		// far as its holder can tell.
		return nil, Errorf(wire.CodeLeaseExpired, "lease %s has expired", id)
	}
	return l, nil
}

// renewal is what one renewal asks besides the lease and its token.
type renewal struct {
	ttlMS    int64
	ttlTicks uint64
	wallMS   int64
	// setMeta: replace the lease's metadata with meta (validated).
	meta    map[string]string
	setMeta bool
	// group: the renewal of a whole lease group (group.go); a member is
	// renewed only so.
	group bool
}

func (lb *leaseBook) renewOne(id string, tok Hash, r renewal) (*Lease, *wire.Error) {
	if canaryRenewToken && lb.leases.Get(id) != nil {
		tok = lb.leases.Get(id).TokenHash
	}
	if r.setMeta {
		if err := ValidMetadata(r.meta); err != nil {
			return nil, err
		}
	}
	l, err := lb.checkLease(id, tok, Hash{})
	if err != nil {
		return nil, err
	}
	if g := l.GroupID(); g != "" && !r.group {
		return nil, InvalidField("lease_id", "lease %s is a member of lease group %s: renew the group", id, g)
	}
	if l.SessionID != "" {
		if !r.setMeta {
			return nil, InvalidField("lease_id", "lease %s is bound to session %s: heartbeat the session instead", id, l.SessionID)
		}
		if r.ttlTicks > 0 {
			return nil, InvalidField("ttl_ms", "lease %s is bound to session %s: it takes the session's ttl", id, l.SessionID)
		}
	}
	nl := *l
	if r.ttlTicks > 0 {
		nl.TTLMS, nl.TTLTicks = r.ttlMS, r.ttlTicks
	}
	if l.SessionID == "" {
		if end := lb.tick + nl.TTLTicks; end > nl.ExpiresTick {
			nl.ExpiresTick = end // the lease's timer moves when it comes due (applyTick)
		}
	}
	if r.setMeta {
		meta := nilIfEmpty(r.meta)
		nl.setCold(func(c *leaseCold) { c.metadata = meta })
	}
	if nl.RenewalCount < ^uint32(0) {
		nl.RenewalCount++
	}
	nl.RenewedWallMS = r.wallMS
	lb.leases.Put(&nl)
	lb.emit(Event{Type: EventRenewed, WallMS: r.wallMS, Key: l.Key, Lease: &nl})
	return &nl, nil
}

// validRenewTTL checks the new TTL a renewal may carry (0: keep it).
func validRenewTTL(ms int64, ticks uint64) *wire.Error {
	if ticks > 0 && ms <= 0 || ticks > MaxTicks {
		return InvalidField("ttl_ms", "ttl_ms must be positive")
	}
	return nil
}

func (lb *leaseBook) renew(c *Renew) Result {
	if err := validRenewTTL(c.TTLMS, c.TTLTicks); err != nil {
		return Result{Err: err}
	}
	l, err := lb.renewOne(c.LeaseID, c.TokenHash, renewal{ttlMS: c.TTLMS, ttlTicks: c.TTLTicks, wallMS: c.WallMS,
		meta: c.Metadata, setMeta: c.SetMetadata})
	return Result{Lease: l, Err: err}
}

func (lb *leaseBook) heartbeat(c *Heartbeat) Result {
	if len(c.Items) == 0 || len(c.Items) > MaxHeartbeatSize {
		return Result{Err: InvalidField("leases", "a heartbeat carries 1-%d leases, got %d", MaxHeartbeatSize, len(c.Items))}
	}
	items := make([]ItemResult, len(c.Items))
	for i, it := range c.Items {
		l, err := lb.renewOne(it.LeaseID, it.TokenHash, renewal{wallMS: c.WallMS, meta: it.Metadata, setMeta: it.SetMetadata})
		items[i] = ItemResult{LeaseID: it.LeaseID, Lease: l, Err: err}
	}
	return Result{Items: items}
}

func (lb *leaseBook) release(c *Release) Result {
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	l, err := lb.checkLease(c.LeaseID, c.TokenHash, c.SessionTokenHash)
	if err != nil {
		return Result{Err: err}
	}
	if g := l.GroupID(); g != "" {
		return Result{Err: InvalidField("lease_id", "lease %s is a member of lease group %s: release the group", c.LeaseID, g)}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonReleased)
	if canaryFenceReset {
		lb.fence = l.Fence - 1
	}
	if canaryFenceRepeat {
		if lb.canaryReleased == nil {
			lb.canaryReleased = map[string]uint64{}
		}
		lb.canaryReleased[l.Key] = l.Fence
	}
	return Result{Lease: lb.end(l, endOpts{state: StateReleased, reason: reason, wallMS: c.WallMS})}
}

func (lb *leaseBook) revoke(c *Revoke) Result {
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	if err := validID("lease_id", c.LeaseID); err != nil {
		return Result{Err: err}
	}
	l := lb.leases.Get(c.LeaseID)
	if l == nil {
		return Result{Err: Errorf(wire.CodeLeaseNotFound, "lease %s not found", c.LeaseID)}
	}
	if l.Terminal() {
		return Result{Err: terminalError(l)}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonRevoked)
	o := endOpts{state: StateRevoked, reason: reason, wallMS: c.WallMS, delay: true, midTick: true}
	if g := l.GroupID(); g != "" {
		res, _ := lb.grp.endGroup(g, l.ID, o) // a group ends whole
		return res
	}
	return Result{Lease: lb.end(l, o)}
}

func (lb *leaseBook) releaseHolder(c *ReleaseHolder) Result {
	if err := ValidHolder(c.Holder); err != nil {
		return Result{Err: err}
	}
	if err := ValidReason(c.Reason); err != nil {
		return Result{Err: err}
	}
	reason := c.Reason
	reason = cmp.Or(reason, ReasonHolderReleased)
	n := lb.dropWaitersOf(c.Holder)
	hi := lb.holders[c.Holder]
	if hi == nil {
		return Result{Count: n}
	}
	for _, id := range hi.leases.ids() {
		lb.end(lb.leases.Get(id), endOpts{state: StateRevoked, reason: reason, wallMS: c.WallMS})
		n++
	}
	for _, id := range hi.sessions.ids() {
		lb.sess.endSession(lb.sess.Session(id), SessionEnded, reason, c.WallMS)
		n++
	}
	return Result{Count: n}
}

// dropWaitersOf withdraws every queued acquire of holder (directly or
// through one of its sessions), so that ending its leases cannot hand it a
// new one; each waiter is told with a notice. It returns how many it
// withdrew.
func (lb *leaseBook) dropWaitersOf(holder string) int {
	hw := lb.holderWaits[holder]
	ids := sortedKeys(hw)
	n := 0
	for _, id := range ids {
		key := hw[id]
		ks := lb.keys.Get(key)
		if w, ok := lb.findWaiter(key, id); ok && w.group != "" {
			// Its keys are pumped once every waiter of the holder is
			// gone, so that none of them is granted meanwhile.
			lb.grp.withdrawGroup(w.group, Errorf(wire.CodeLeaseRevoked, "all leases of holder %s were released while this lease group waited", holder))
			n++
			continue
		}
		w, ok := lb.unqueue(ks, id)
		if !ok {
			continue
		}
		lb.dropWaiter(w.Cmd, id, Errorf(wire.CodeLeaseRevoked, "all leases of holder %s were released while this acquire waited", holder))
		lb.dropKey(key, ks)
		n++
	}
	lb.grp.repumpKeys()
	return n
}

func (lb *leaseBook) cancelWait(c *CancelWait) {
	ks := lb.keys.Get(c.Key)
	if ks == nil {
		return
	}
	if w, ok := lb.findWaiter(c.Key, c.LeaseID); ok && w.group != "" {
		lb.grp.withdrawGroup(w.group, nil) // any member names the whole group
		lb.grp.repumpKeys()
		return
	}
	if w, ok := lb.unqueue(ks, c.LeaseID); ok {
		lb.forgetIdem(w.Cmd.IdemHash, c.LeaseID)
		lb.pump(c.Key, ks)
	}
}

func (lb *leaseBook) holder(h string) *holderIndex {
	hi := lb.holders[h]
	if hi == nil {
		hi = &holderIndex{name: h}
		lb.holders[h] = hi
	}
	return hi
}

func (lb *leaseBook) dropHolder(h string) {
	if hi := lb.holders[h]; hi != nil && hi.leases.n == 0 && hi.sessions.n == 0 {
		delete(lb.holders, h)
	}
}

// anyKey reports whether some lease record has key (when not empty) and a
// key starting with prefix.
func (lb *leaseBook) anyKey(key, prefix string) bool {
	if key != "" {
		return lb.keyIdx.count(key) > 0 && strings.HasPrefix(key, prefix)
	}
	if prefix == "" || lb.keyIdx.count(prefix) > 0 {
		return true
	}
	found := false
	lb.keyIdx.ascend(prefix, func(k string) bool {
		found = strings.HasPrefix(k, prefix)
		return false
	})
	return found
}
