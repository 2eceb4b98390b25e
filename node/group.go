package node

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/leasehold/leasehold/wire"
)

// GroupIDPrefix starts the id of every lease group.
const GroupIDPrefix = "lg_"

// validateGroup checks a group acquire as validateAcquire checks one
// acquire, for each key, and that the keys are 1-fsm.MaxGroupKeys and
// distinct. It sets each key's limit to 1 where it is 0. A field error
// about a key names it (keys[i]).
func (c *Config) validateGroup(r *wire.GroupAcquireRequest) *wire.Error {
	if len(r.Keys) == 0 || len(r.Keys) > fsm.MaxGroupKeys {
		return fsm.InvalidField("keys", "keys must list 1-%d keys, got %d", fsm.MaxGroupKeys, len(r.Keys))
	}
	seen := make(map[string]bool, len(r.Keys))
	for i := range r.Keys {
		k := &r.Keys[i]
		k.Limit = cmp.Or(k.Limit, 1)
		a := wire.AcquireRequest{Key: k.Key, Holder: r.Holder, TTLMS: r.TTLMS, SessionID: r.SessionID,
			SessionToken: r.SessionToken, Limit: k.Limit, Metadata: r.Metadata, IdempotencyKey: r.IdempotencyKey,
			WaitMS: r.WaitMS, LockDelayMS: r.LockDelayMS}
		if err := c.validateAcquire(&a); err != nil {
			if err.Field == "key" || err.Field == "limit" {
				return &wire.Error{Code: err.Code, Field: err.Field, Message: fmt.Sprintf("keys[%d]: %s", i, err.Message)}
			}
			return err
		}
		if seen[k.Key] {
			return fsm.InvalidField("keys", "keys[%d]: key %q is listed twice", i, k.Key)
		}
		seen[k.Key] = true
	}
	return nil
}

// groupFingerprint identifies a group acquire for idempotency: its keys
// with their limits (in key order) and everything else it asks. It differs
// from every single acquire's fingerprint.
func groupFingerprint(r *wire.GroupAcquireRequest, keys []wire.GroupKey) fsm.Hash {
	meta := make([][2]string, 0, len(r.Metadata))
	for k, v := range r.Metadata {
		meta = append(meta, [2]string{k, v})
	}
	slices.SortFunc(meta, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	b, _ := json.Marshal([]any{"group", keys, r.Holder, r.TTLMS, r.SessionID, r.LockDelayMS, meta})
	return sha256.Sum256(b)
}

// AcquireGroup takes a lease on each of several keys in one log entry,
// all or nothing, or queues for them together when WaitMS > 0 (a group is
// granted once every one of its keys can be granted to it, in turn on
// each key: see package fsm). It returns the group with its secret token
// (every member's token) and its leases in key order, each with its own
// fencing token; replayed is true for an idempotent replay, as Acquire's.
// A refusal changes nothing: LIMIT_MISMATCH, or LEASE_HELD / LOCK_DELAY
// naming the first busy key (in key order) and its holders. While a
// server of the cluster runs a version that does not read lease groups,
// UNAVAILABLE.
func (n *Node) AcquireGroup(ctx context.Context, r wire.GroupAcquireRequest) (*wire.LeaseGroup, bool, error) {
	r.Keys = slices.Clone(r.Keys)
	if err := n.cfg.validateGroup(&r); err != nil {
		return nil, false, err
	}
	if err := n.serversRead("lease groups", func(p cluster.Peer) bool { return p.LeaseGroups }); err != nil {
		return nil, false, err
	}
	if err := n.disk.growthRefused(); err != nil {
		return nil, false, err
	}
	slices.SortFunc(r.Keys, func(a, b wire.GroupKey) int { return strings.Compare(a.Key, b.Key) })
	period := n.tk.period()
	token := newToken()
	cmd := &fsm.AcquireGroup{
		GroupID: newID(GroupIDPrefix), Holder: r.Holder, SessionID: r.SessionID,
		SessionTokenHash: hashToken(r.SessionToken), TokenHash: hashToken(token),
		TTLMS: r.TTLMS, TTLTicks: ticks(r.TTLMS, period), Metadata: r.Metadata,
		WaitTicks: ticks(r.WaitMS, period), LockDelayMS: r.LockDelayMS, WallMS: wallNow().UnixMilli(),
		Quota: n.cfg.quota(),
	}
	for _, k := range r.Keys {
		cmd.Keys = append(cmd.Keys, fsm.GroupKey{LeaseID: newID("ls_"), Key: k.Key, Limit: k.Limit})
	}
	if r.LockDelayMS > 0 {
		cmd.LockDelayTicks = ticks(r.LockDelayMS, period) + 1 // as Acquire's
	}
	var sealKeyBytes []byte
	if r.IdempotencyKey != "" {
		cmd.Fingerprint = groupFingerprint(&r, r.Keys)
		cmd.IdemHash, cmd.SealedToken, sealKeyBytes = n.sg.sealIdempotent(r.Holder, r.SessionID, r.IdempotencyKey, cmd.Fingerprint, token)
	}
	first := cmd.Keys[0]
	var wait chan fsm.Notice
	if r.WaitMS > 0 {
		wait = n.waits.add(cmd.GroupID)
		defer n.waits.drop(cmd.GroupID, wait)
	}
	// Any member names the group, for a withdrawal.
	res, err := n.proposeAcquire(ctx, cmd, r.WaitMS, first.LeaseID, first.Key)
	if err != nil {
		return nil, false, err
	}
	ls := res.Leases
	if res.Queued {
		// A replay of a queued group waits for the original's grant.
		g, head := ls[0].GroupID(), ls[0]
		start := monoNow()
		ls, err = n.queued.awaitGroup(ctx, g, head.ID, head.Key, wait, time.Duration(r.WaitMS)*time.Millisecond)
		n.queued.observeWait(start, err)
		if err != nil {
			return nil, false, err
		}
	}
	v := n.rep.renderGroup(ls)
	v.Token = answerToken(res.Replayed, token, sealKeyBytes, ls[0])
	return v, res.Replayed, nil
}

func (r *replica) renderGroup(ls []*fsm.Lease) *wire.LeaseGroup {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.groupView(ls, wallNow())
}

// groupView renders a group's members; the group's state and countdown
// are its first member's (they share them). The caller holds r.mu.
func (r *replica) groupView(ls []*fsm.Lease, now time.Time) *wire.LeaseGroup {
	views := make([]*wire.Lease, len(ls))
	for i, l := range ls {
		views[i] = r.view(l, now)
	}
	f := views[0]
	return &wire.LeaseGroup{GroupID: ls[0].GroupID(), Holder: f.Holder, SessionID: f.SessionID, State: f.State,
		TTLMS: f.TTLMS, RemainingMS: f.RemainingMS, ExpiresAt: f.ExpiresAt, HeartbeatIntervalMS: f.HeartbeatIntervalMS, Leases: views}
}

func checkGroupID(id string) *wire.Error {
	if id == "" || len(id) > fsm.MaxIDBytes {
		return fsm.Errorf(wire.CodeLeaseNotFound, "lease group %q not found", id)
	}
	return nil
}

// RenewGroup renews every lease of a standalone lease group with the
// group's token, by its TTL (or by TTLMS, which becomes its TTL), in one
// log entry; refused as a whole, changing nothing, if any member cannot
// be renewed. A group bound to a session is renewed by its session's
// heartbeat (INVALID_ARGUMENT here).
func (n *Node) RenewGroup(ctx context.Context, r wire.GroupRenewRequest) (*wire.LeaseGroup, error) {
	if err := checkGroupID(r.GroupID); err != nil {
		return nil, err
	}
	if r.Token == "" {
		return nil, fsm.InvalidField("token", "the lease group's token (X-Lease-Token) is required")
	}
	cmd := &fsm.RenewGroup{GroupID: r.GroupID, TokenHash: hashToken(r.Token), WallMS: wallNow().UnixMilli()}
	if r.TTLMS != 0 {
		if err := n.cfg.checkTTL("ttl_ms", r.TTLMS); err != nil {
			return nil, err
		}
		cmd.TTLMS, cmd.TTLTicks = r.TTLMS, ticks(r.TTLMS, n.tk.period())
	}
	if err := n.serversRead("lease groups", func(p cluster.Peer) bool { return p.LeaseGroups }); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.rep.renderGroup(res.Leases), nil
}

// ReleaseGroup ends every lease of a lease group (released, with reason)
// in one log entry. The group's token authenticates it; for a group bound
// to a session the session token may be used instead.
func (n *Node) ReleaseGroup(ctx context.Context, r wire.GroupReleaseRequest) (*wire.LeaseGroup, error) {
	if err := checkGroupID(r.GroupID); err != nil {
		return nil, err
	}
	if r.Token == "" && r.SessionToken == "" {
		return nil, fsm.InvalidField("token", "the lease group's token (X-Lease-Token) or, for a bound group, the session token is required")
	}
	if err := fsm.ValidReason(r.Reason); err != nil {
		return nil, err
	}
	if err := n.serversRead("lease groups", func(p cluster.Peer) bool { return p.LeaseGroups }); err != nil {
		return nil, err
	}
	res, _, err := n.propose(ctx, &fsm.ReleaseGroup{GroupID: r.GroupID, TokenHash: hashToken(r.Token),
		SessionTokenHash: hashToken(r.SessionToken), Reason: r.Reason, WallMS: wallNow().UnixMilli()})
	if err != nil {
		return nil, err
	}
	if res.Err != nil {
		return nil, res.Err
	}
	return n.rep.renderGroup(res.Leases), nil
}

// GetGroup reads a lease group in any state still retained (a group that
// is still queued is not found until granted). Linearizable unless stale.
func (n *Node) GetGroup(ctx context.Context, id string, stale bool) (*wire.LeaseGroup, error) {
	if err := checkGroupID(id); err != nil {
		return nil, err
	}
	if err := n.readBarrier(ctx, stale); err != nil {
		return nil, err
	}
	n.rep.mu.RLock()
	defer n.rep.mu.RUnlock()
	ls := n.rep.f.Group(id)
	if len(ls) == 0 {
		return nil, fsm.Errorf(wire.CodeLeaseNotFound, "lease group %s not found", id)
	}
	return n.rep.groupView(ls, wallNow()), nil
}
