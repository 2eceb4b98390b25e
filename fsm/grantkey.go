package fsm

import "github.com/leasehold/leasehold/wire"

// Grant signing keys in the member registry. Each server signs the grants
// it answers with an Ed25519 key of its own (package node; the private key
// never leaves the server). Its public key is recorded in the server's
// member record, so that every server can serve the cluster's key set (GET
// /v1/keys) from the replicated state. The leader decides what to record
// (from gossip) before proposing; the state machine only stores it.
//
// A MemberKey command makes a key the server's current one; the key it
// replaces is kept as retired, with the tick it was retired at, so that
// grants signed just before a rotation can still be verified for a while
// (how long is the serving node's choice: it filters by that tick). A
// Member command that tombstones the server or records another data
// directory for it retires its current key the same way. At most
// MaxRetiredGrantKeys retired keys are kept per server, newest first.
//
// MemberKey, and the longer snapshot record of a member with keys, are
// proposed only once every server reads them (the node checks gossip).

// TypeMemberKey is the type of a MemberKey entry.
const TypeMemberKey Type = 22

// GrantKeyBytes is the size of a grant signing key's public half (Ed25519).
const GrantKeyBytes = 32

// MaxRetiredGrantKeys bounds the retired keys a member record keeps.
const MaxRetiredGrantKeys = 4

// GrantKey is an Ed25519 public key. The zero value means none.
type GrantKey [GrantKeyBytes]byte

// IsZero reports whether k is the zero key (none).
func (k GrantKey) IsZero() bool { return k == GrantKey{} }

// RetiredGrantKey is a key a server no longer signs with.
type RetiredGrantKey struct {
	Key GrantKey
	// Tick is the cluster tick at which the key was retired.
	Tick uint64
}

// GrantKeys are the grant signing keys of one server. A value in the
// registry is never modified: a change replaces it.
type GrantKeys struct {
	// Current is the key the server signs with; zero when it has none (a
	// removed server, or one whose data directory was replaced, until its
	// new key is recorded).
	Current GrantKey
	// Retired are its earlier keys, most recently retired first.
	Retired []RetiredGrantKey
}

// MemberKey records key as the current grant signing key of server ID,
// which must have a member record that is not a tombstone.
type MemberKey struct {
	ID  string   `json:"id"`
	Key GrantKey `json:"key"`
}

func (*MemberKey) Type() Type { return TypeMemberKey }

// memberKey applies a MemberKey: the key becomes the server's current one
// (the one it replaces is retired at the current tick; a retired key
// recorded again leaves the retired list). Refused, changing nothing: a bad
// id, the zero key, a server the registry does not have or has tombstoned.
// The record keeps the index of the Member command that wrote it.
func (r *registry) memberKey(c *MemberKey) Result {
	if err := validName("id", c.ID, MaxServerIDBytes); err != nil {
		return Result{Err: err}
	}
	if c.Key.IsZero() {
		return Result{Err: InvalidField("key", "the grant key must not be zero")}
	}
	rec, ok := r.members[c.ID]
	switch {
	case !ok:
		return Result{Err: Errorf(wire.CodeNotFound, "server %s has no member record", quote(c.ID))}
	case rec.Removed:
		return Result{Err: InvalidField("id", "server %s was removed", quote(c.ID))}
	case rec.GrantKeys != nil && rec.GrantKeys.Current == c.Key:
		return Result{}
	}
	keys := &GrantKeys{Current: c.Key}
	if old := rec.GrantKeys; old != nil {
		if !old.Current.IsZero() {
			keys.Retired = append(keys.Retired, RetiredGrantKey{Key: old.Current, Tick: r.tick})
		}
		for _, r := range old.Retired {
			if r.Key != c.Key && len(keys.Retired) < MaxRetiredGrantKeys {
				keys.Retired = append(keys.Retired, r)
			}
		}
	}
	rec.GrantKeys = keys
	r.members[c.ID] = rec
	return Result{}
}

// retireCurrent returns keys with its current key retired at tick (keys
// itself when it has no current key).
func (keys *GrantKeys) retireCurrent(tick uint64) *GrantKeys {
	if keys == nil || keys.Current.IsZero() {
		return keys
	}
	out := &GrantKeys{Retired: make([]RetiredGrantKey, 0, min(len(keys.Retired)+1, MaxRetiredGrantKeys))}
	out.Retired = append(out.Retired, RetiredGrantKey{Key: keys.Current, Tick: tick})
	for _, r := range keys.Retired {
		if len(out.Retired) < MaxRetiredGrantKeys {
			out.Retired = append(out.Retired, r)
		}
	}
	return out
}

func (c *MemberKey) fields(f fields) {
	f.str(&c.ID)
	f.hash((*Hash)(&c.Key)) // as many bytes
}

// The keys of a member's snapshot record, after its other fields and only
// when it has some: the current key (32 bytes, zero for none), a count of
// retired keys, and each retired key (32 bytes) with its tick.

func encodeGrantKeys(e *enc, k *GrantKeys) {
	if k == nil {
		return
	}
	e.b = append(e.b, k.Current[:]...)
	e.uvarint(uint64(len(k.Retired)))
	for _, r := range k.Retired {
		e.b = append(e.b, r.Key[:]...)
		e.uvarint(r.Tick)
	}
}

func decodeGrantKeys(d *dec) *GrantKeys {
	if len(d.b) == 0 {
		return nil
	}
	k := &GrantKeys{}
	copy(k.Current[:], d.take(GrantKeyBytes))
	n := d.count(GrantKeyBytes + 1)
	if n > MaxRetiredGrantKeys {
		d.fail("too many retired grant keys")
		return nil
	}
	if n > 0 {
		k.Retired = make([]RetiredGrantKey, n)
	}
	for i := range k.Retired {
		copy(k.Retired[i].Key[:], d.take(GrantKeyBytes))
		k.Retired[i].Tick = d.uvarint()
		if k.Retired[i].Key.IsZero() && d.err == nil {
			d.fail("zero retired grant key")
		}
	}
	if d.err == nil && k.Current.IsZero() && n == 0 {
		d.fail("grant keys written without a key")
	}
	return k
}
