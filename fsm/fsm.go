package fsm

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/leasehold/leasehold/wire"
)

// Limits on what one request may carry. The node validates them before
// proposing; the state machine checks them again so that a bad entry can
// never put the state outside them.
const (
	MaxKeyBytes      = 512
	MaxHolderBytes   = 128
	MaxLimit         = 10000
	MaxMetaEntries   = 16
	MaxMetaBytes     = 4096
	MaxReasonBytes   = 256
	MaxIDBytes       = 64
	MaxHeartbeatSize = 10000
	// MaxTicks bounds any duration in ticks, so tick arithmetic never
	// overflows (about 3.5 years at a 10 ms tick period).
	MaxTicks = 1 << 33
)

const (
	kindLease   = 1
	kindSession = 2
	kindWait    = 3
	kindDelay   = 4
)

// timer is a deadline in a bucket. Buckets may hold stale timers (a renewed
// lease keeps its old one); they are checked against the record when due.
type timer struct {
	kind uint8
	id   string // lease, session or waiter id; the key for kindDelay
}

type blocked struct {
	Until   uint64 `json:"until"`
	LeaseID string `json:"lease_id"`
}

type waiter struct {
	Cmd      *Acquire `json:"cmd"`
	Deadline uint64   `json:"deadline"`
	// group is the lease group the acquire is a member of (group.go):
	// it is queued on every key of the group at once; "" for an acquire
	// of one key.
	group string
}

// keyState is everything about one key that is not in its lease records.
// Most keys have one active lease and nothing else, so that lease's id is
// kept in the state itself; several active ids, lock-delays, waiters and
// stolen slots are behind a pointer that is nil while there are none.
type keyState struct {
	key   string // its name: the keys table finds it by this
	limit uint32
	// refs is used only by rebuild, to count the key's lease records
	// without sorting every lease's key (it fills the padding after
	// limit); zero otherwise.
	refs int32
	one  [1]string // the active lease id when there is exactly one
	more *keyMore
}

func (k *keyState) tableName() string { return k.key }

type keyMore struct {
	active  []string  // active lease ids in grant (fence) order, when several
	blocked []blocked // slots in lock-delay
	waitq   waitQueue // queued acquires, first come first served
	stolen  []string  // leases that ended involuntarily, slot not yet re-granted
}

// active returns the active lease ids in grant (fence) order. The slice is
// the key's own: it is valid until the key changes.
func (k *keyState) active() []string {
	switch {
	case k.one[0] != "":
		return k.one[:]
	case k.more != nil:
		return k.more.active
	}
	return nil
}

// addActive appends id (the newest grant) to the active ids.
func (k *keyState) addActive(id string) {
	switch {
	case k.one[0] != "":
		k.ext().active = []string{k.one[0], id}
		k.one[0] = ""
	case k.more != nil && len(k.more.active) > 0:
		k.more.active = append(k.more.active, id)
	default:
		k.one[0] = id
	}
}

// removeActiveAt removes the i-th active id. The shorter side of a long
// list moves to close the gap.
func (k *keyState) removeActiveAt(i int) {
	if k.one[0] != "" {
		k.one[0] = ""
		return
	}
	a := k.more.active
	if i < len(a)/2 {
		copy(a[1:i+1], a[:i])
		a[0] = ""
		a = a[1:]
	} else {
		a = slices.Delete(a, i, i+1)
	}
	if len(a) == 1 {
		k.one[0], a = a[0], nil
	}
	k.more.active = a
	k.tidy()
}

func (k *keyState) blocked() []blocked {
	if k.more == nil {
		return nil
	}
	return k.more.blocked
}

// waiters returns the queued acquires in order, in a new slice (O(n): for
// snapshots and tests, not for apply).
func (k *keyState) waiters() []waiter {
	if k.more == nil {
		return nil
	}
	return k.more.waitq.list()
}

// nWaiters is the number of queued acquires.
func (k *keyState) nWaiters() int {
	if k.more == nil {
		return 0
	}
	return k.more.waitq.len()
}

func (k *keyState) stolen() []string {
	if k.more == nil {
		return nil
	}
	return k.more.stolen
}

// ext returns the key's keyMore for a change, making it if need be.
func (k *keyState) ext() *keyMore {
	if k.more == nil {
		k.more = new(keyMore)
	}
	return k.more
}

// addStolen appends id to the leases that ended involuntarily on the key.
// A key without a keyMore gets one with room for id in the same
// allocation, since in a storm of expiries every key takes this path.
func (k *keyState) addStolen(id string) {
	if k.more == nil {
		m := &keyMoreStolen{first: [1]string{id}}
		m.stolen = m.first[:]
		k.more = &m.keyMore
		return
	}
	k.more.stolen = append(k.more.stolen, id)
}

// keyMoreStolen is a keyMore made for its first stolen id, and room for it.
type keyMoreStolen struct {
	keyMore
	first [1]string
}

// tidy drops the keyMore once it holds nothing.
func (k *keyState) tidy() {
	if m := k.more; m != nil && len(m.active) == 0 && len(m.blocked) == 0 && m.waitq.len() == 0 && len(m.stolen) == 0 {
		k.more = nil
	}
}

func (k *keyState) inUse() bool {
	return len(k.active()) > 0 || len(k.blocked()) > 0 || k.nWaiters() > 0
}

func (k *keyState) free() int {
	return int(k.limit) - len(k.active()) - len(k.blocked())
}

// holderIndex is what a holder has active, in id order.
type holderIndex struct {
	name     string // the holder; records of the holder share this string
	leases   idIndex
	sessions idIndex
}

type pruneItem struct {
	tick uint64
	kind uint8
	id   string
}

// FSM is the lease state machine. The zero value is not usable; call New.
//
// It dispatches each command to the part that owns the job (DESIGN.md,
// "Parts"): leaseBook (leases, keys, their waiters and holders),
// sessionBook, groupBook (lease groups), expiry (timers, the backlog,
// pruning), registry (members, cluster id, seal check, features) and
// staging (a restore being received). Each part keeps its own state; the
// log position and the entry's events and notices are the core, which
// every part shares. The parts are embedded, so their query methods are
// the FSM's.
type FSM struct {
	core
	leaseBook
	sessionBook
	groupBook
	expiry
	registry
	staging
}

// core is where the state machine is in the log and in time, the fencing
// counter, and what the entry being applied produced (events, notices).
// Every part reads it through a pointer; only Apply, applyTick and the
// fence change its position.
type core struct {
	index    uint64
	tick     uint64
	periodMS int64
	wallMS   int64
	fence    uint64

	seq     uint32
	events  []Event
	notices []Notice
}

// New returns an empty state machine.
func New() *FSM {
	f := &FSM{
		leaseBook: leaseBook{
			leases:      newTable[*Lease](),
			keys:        newTable[*keyState](),
			idem:        make(map[Hash]string),
			waiting:     make(map[string]string),
			holderWaits: make(map[string]map[string]string),
			holders:     make(map[string]*holderIndex),
		},
		sessionBook: sessionBook{sessions: make(map[string]*Session)},
		groupBook:   groupBook{groups: make(map[string][]string), groupWaits: make(map[string][]waiter)},
		expiry:      expiry{buckets: make(map[uint64]*bucket)},
		registry:    registry{members: make(map[string]MemberRecord)},
	}
	f.link()
	return f
}

// link points the parts at each other and at the core. New calls it, and
// so does every assignment of a whole FSM (replace).
func (f *FSM) link() {
	c := &f.core
	f.leaseBook.core, f.leaseBook.sess, f.leaseBook.exp, f.leaseBook.grp = c, &f.sessionBook, &f.expiry, &f.groupBook
	f.sessionBook.core, f.sessionBook.lb, f.sessionBook.exp = c, &f.leaseBook, &f.expiry
	f.groupBook.core, f.groupBook.lb, f.groupBook.sess = c, &f.leaseBook, &f.sessionBook
	f.expiry.core, f.expiry.lb, f.expiry.sess, f.expiry.grp = c, &f.leaseBook, &f.sessionBook, &f.groupBook
	f.registry.core = c
	f.staging.core = c
}

// replace makes f the state n holds (n is not used afterwards).
func (f *FSM) replace(n *FSM) {
	*f = *n
	f.link()
}

// Apply applies the command of the log entry at index and returns one result
// per command (one, or one per command of a Batch). Events and notices it
// produced are collected until TakeEvents / TakeNotices.
func (f *FSM) Apply(index uint64, c Command) []Result {
	if index <= f.index {
		panic(fmt.Sprintf("fsm: apply index %d not after %d", index, f.index))
	}
	f.index = index
	f.seq = 0
	if b, ok := c.(*Batch); ok {
		out := make([]Result, len(b.Commands))
		for i, sub := range b.Commands {
			out[i] = f.apply1(sub)
		}
		return out
	}
	return []Result{f.apply1(c)}
}

// TakeEvents returns the events produced since the last call and forgets them.
func (c *core) TakeEvents() []Event {
	ev := c.events
	c.events = nil
	if len(ev) == 0 {
		return nil // even if a tick made room for events it did not emit
	}
	return ev
}

// DrainEvents calls fn for each event produced since the last drain, in
// order, and forgets them, keeping the buffer for the next Apply. fn must not
// retain the pointer it is given.
func (c *core) DrainEvents(fn func(*Event)) {
	for i := range c.events {
		fn(&c.events[i])
		c.events[i] = Event{}
	}
	c.events = c.events[:0]
}

// TakeNotices returns the wait notices produced since the last call.
func (c *core) TakeNotices() []Notice {
	n := c.notices
	c.notices = nil
	return n
}

func (f *FSM) apply1(c Command) Result {
	switch c := c.(type) {
	case *Tick:
		f.applyTick(c)
		return Result{}
	case *Expire:
		f.applyExpire(c)
		return Result{}
	case *Acquire:
		return f.acquire(c)
	case *Renew:
		return f.renew(c)
	case *Release:
		return f.release(c)
	case *Revoke:
		return f.revoke(c)
	case *Heartbeat:
		return f.heartbeat(c)
	case *SessionCreate:
		return f.sessionCreate(c)
	case *SessionHeartbeat:
		return f.sessionHeartbeat(c)
	case *SessionEnd:
		return f.sessionEnd(c)
	case *ReleaseHolder:
		return f.releaseHolder(c)
	case *CancelWait:
		f.cancelWait(c)
		return Result{}
	case *Member:
		return f.member(c)
	case *MemberKey:
		return f.memberKey(c)
	case *AcquireGroup:
		return f.acquireGroup(c)
	case *RenewGroup:
		return f.renewGroup(c)
	case *ReleaseGroup:
		return f.releaseGroup(c)
	case *ClusterID:
		return f.clusterIDCmd(c)
	case *SealCheck:
		return f.sealCheckCmd(c)
	case *FeaturesCmd:
		return f.featuresCmd(c)
	case *RestoreChunk:
		return f.restoreChunk(c)
	case *RestoreCommit:
		return f.restoreCommit(c)
	default:
		panic(fmt.Sprintf("fsm: no handler for %T", c))
	}
}

func (c *core) emit(e Event) {
	e.Index = c.index
	e.Seq = c.seq
	e.Tick = c.tick
	c.seq++
	c.events = append(c.events, e)
}

// schedule sets a timer for tick at. One already due (only a restore sets
// those: the records a limited tick left) goes to the backlog, which the
// caller then puts in order.
func (e *expiry) schedule(at uint64, kind uint8, id string) {
	if at <= e.tick {
		e.backlog = append(e.backlog, timer{kind: kind, id: id})
		return
	}
	b := e.buckets[at]
	if b == nil {
		b = &bucket{}
		e.buckets[at] = b
	}
	if kind == kindLease {
		b.leases = append(b.leases, id)
	} else {
		b.other = append(b.other, timer{kind: kind, id: id})
	}
}

func (c *core) nextFence() uint64 {
	if canaryFenceReset {
		c.fence++ // the canary's counter does not follow the log index
		return c.fence
	}
	c.fence = max(c.fence+1, c.index)
	return c.fence
}

// remainingMS is the time left before nominal tick end, in milliseconds.
func (c *core) remainingMS(end uint64) int64 {
	if end <= c.tick {
		return 0
	}
	return int64(end-c.tick) * c.periodMS
}

func terminalError(l *Lease) *wire.Error {
	switch l.State {
	case StateExpired:
		return Errorf(wire.CodeLeaseExpired, "lease %s has expired", l.ID)
	case StateReleased:
		return Errorf(wire.CodeLeaseReleased, "lease %s was released", l.ID)
	default:
		return Errorf(wire.CodeLeaseRevoked, "lease %s was revoked", l.ID)
	}
}

// ValidKey reports whether k is an acceptable key: 1-512 bytes of UTF-8
// without control characters.
func ValidKey(k string) *wire.Error { return validName("key", k, MaxKeyBytes) }

// ValidHolder reports whether h is an acceptable holder: 1-128 bytes of
// UTF-8 without control characters.
func ValidHolder(h string) *wire.Error { return validName("holder", h, MaxHolderBytes) }

func validName(field, s string, maxBytes int) *wire.Error {
	if len(s) == 0 || len(s) > maxBytes {
		return wire.OutOfRange(field, 1, int64(maxBytes), int64(len(s)), "bytes")
	}
	if !validUTF8(s) {
		return InvalidField(field, "%s is not valid UTF-8", field)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7F || (r >= 0x80 && r < 0xA0) {
			return InvalidField(field, "%s contains a control character", field)
		}
	}
	return nil
}

// ValidMetadata checks the metadata limits: at most 16 entries and 4 KiB of
// keys and values in all.
func ValidMetadata(m map[string]string) *wire.Error {
	if len(m) > MaxMetaEntries {
		return InvalidField("metadata", "at most %d metadata entries, got %d", MaxMetaEntries, len(m))
	}
	n := 0
	for k, v := range m {
		if k == "" {
			return InvalidField("metadata", "metadata keys must not be empty")
		}
		if !validUTF8(k) || !validUTF8(v) {
			return InvalidField("metadata", "metadata must be valid UTF-8")
		}
		n += len(k) + len(v)
	}
	if n > MaxMetaBytes {
		return InvalidField("metadata", "metadata is %d bytes, at most %d allowed", n, MaxMetaBytes)
	}
	return nil
}

// ValidReason checks a release or revoke reason.
func ValidReason(r string) *wire.Error {
	if len(r) > MaxReasonBytes || !validUTF8(r) {
		return InvalidField("reason", "reason must be valid UTF-8 of at most %d bytes", MaxReasonBytes)
	}
	return nil
}

func validID(field, id string) *wire.Error {
	if id == "" || len(id) > MaxIDBytes {
		return InvalidField(field, "%s must be 1-%d bytes", field, MaxIDBytes)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func quote(s string) string { return strconv.Quote(s) }

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
