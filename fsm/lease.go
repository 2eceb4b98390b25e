package fsm

import (
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

func (lb *leaseBook) forgetIdem(h Hash, id string) {
	if !h.IsZero() && lb.idem[h] == id {
		delete(lb.idem, h)
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
