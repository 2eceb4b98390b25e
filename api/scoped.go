package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// What the routes do with a scoped token (a token whose tokens file entry
// has "keys" or "holders"; scope.go). The policy, which docs/security.md
// states for users:
//
//   - A lease whose key the token may not read, and a session of a holder
//     it may not act as, do not exist for it: every route that names one by
//     id answers exactly as it answers for an id that no object has (404
//     LEASE_NOT_FOUND or SESSION_NOT_FOUND, a heartbeat item's error,
//     validate's "not_found"), and listings and event streams leave them
//     out. The routes that change something get that answer from the node
//     itself: the request is sent on with the id replaced by one that no
//     object has (hiddenID), so that it meets the same checks in the same
//     order as a request naming a missing object, and the answer is given
//     back with the id put back (unhide).
//   - A request whose own content the token may not use (a key outside its
//     write prefixes in an acquire, a holder outside its holders, a key
//     outside its read prefixes to validate) is refused with 403
//     PERMISSION_DENIED before any state is read, so the refusal says
//     nothing about the state. So is a write on a lease the token can see
//     but not write (its key is only readable, or its holder is not the
//     token's): its existence is no secret to the token.
//
// Tokens without restrictions (accessOf is nil) take none of these paths.

// hiddenID returns the id a scoped request about the object id, which its
// token may not see, is sent to the node with: the same length and kind
// prefix ("ls_", "ss_"), with each hex digit after the prefix moved out of
// the hex alphabet (0-9 to g-p, a-f to q-v). The node makes its ids of a
// prefix and hex digits, so no object has a hidden id; distinct ids stay
// distinct.
func hiddenID(id string) string {
	b := []byte(id)
	start := strings.IndexByte(id, '_') + 1
	for i := start; i < len(b); i++ {
		switch c := b[i]; {
		case c >= '0' && c <= '9':
			b[i] = 'g' + (c - '0')
		case c >= 'a' && c <= 'f':
			b[i] = 'q' + (c - 'a')
		}
	}
	return string(b)
}

// unhide gives back the node's answer to a request sent with sent instead
// of id: the same error with id in place of sent. It is err itself when
// nothing was hidden.
func unhide(err error, sent, id string) error {
	var we *wire.Error
	if sent == id || err == nil || !errors.As(err, &we) || we == nil {
		return err
	}
	return unhideError(we, sent, id)
}

func unhideError(we *wire.Error, sent, id string) *wire.Error {
	if we == nil {
		return nil
	}
	c := *we
	c.Message = strings.ReplaceAll(c.Message, sent, id)
	return &c
}

// leaseNotFound and sessionNotFound are what the node answers a read of an
// id no lease or session has (node.Node.GetLease, GetSession).
func leaseNotFound(id string) *wire.Error {
	return &wire.Error{Code: wire.CodeLeaseNotFound, Message: "lease " + id + " not found"}
}

func sessionNotFound(id string) *wire.Error {
	return &wire.Error{Code: wire.CodeSessionNotFound, Message: "session " + id + " not found"}
}

// isCode reports whether err is a contract error with code.
func isCode(err error, code wire.Code) bool {
	var we *wire.Error
	return errors.As(err, &we) && we != nil && we.Code == code
}

// lookup finds the leases and sessions a scoped request names, to decide
// what it may do with them. It reads this node's state first; when that
// does not show the object to the token (not there yet, or not the token's
// to see) it reads again linearizably, once per request (later reads of
// the same request are then as fresh): an object the leader has not
// applied yet is not taken for a missing one, and an existing hidden
// object costs what a missing one costs. A stale lookup (for a
// ?stale=true read, which a follower answers itself) reads this node's
// state only.
type lookup struct {
	s     *core
	ctx   context.Context
	a     *access
	fresh bool
}

func (s *core) lookup(ctx context.Context, a *access, stale bool) *lookup {
	return &lookup{s: s, ctx: ctx, a: a, fresh: stale}
}

// lease returns the lease named id if the token may see it; nil and no
// error when no lease has that id or the token may not see it (hidden
// reports the latter).
func (lk *lookup) lease(id string) (*wire.Lease, bool, error) {
	return lookupVisible(lk, id, lk.s.n.GetLease, func(l *wire.Lease) bool { return lk.a.canRead(l.Key) })
}

// lookupVisible reads the record named id (a lease, a lease group) with
// get, first from this server's state, and again through the leader when
// that one is missing or not visible to the token and no fresh read was
// made yet (a stale copy must not decide a refusal); visible says whether
// the token may see it. The zero value and no error when no record has that
// id or the token may not see it (hidden reports the latter).
func lookupVisible[T any](lk *lookup, id string, get func(context.Context, string, bool) (T, error), visible func(T) bool) (v T, hidden bool, err error) {
	var zero T
	v, err = get(lk.ctx, id, true)
	if err == nil && visible(v) {
		return v, false, nil
	}
	if !lk.fresh {
		v, err = get(lk.ctx, id, false)
		if err != nil && !isCode(err, wire.CodeLeaseNotFound) {
			return zero, false, err
		}
		lk.fresh = true
	}
	switch {
	case err != nil:
		return zero, false, nil
	case !visible(v):
		return zero, true, nil
	}
	return v, false, nil
}

// writeLease returns the id a scoped write on lease id is sent with: id
// itself when the token may write the lease or no lease has that id (the
// node answers as for anyone), hiddenID(id) when the token may not see it,
// and a 403 when it sees the lease but may not write it.
func (lk *lookup) writeLease(id string) (string, error) {
	if lk.a == nil || node.IsControlLeaseID(id) {
		// The node refuses a write on a control lease's id, whether or
		// not it exists, before looking it up.
		return id, nil
	}
	l, hidden, err := lk.lease(id)
	switch {
	case err != nil:
		return "", err
	case hidden:
		return hiddenID(id), nil
	case l == nil:
		return id, nil
	case !lk.a.canWrite(l.Key):
		return "", scopeDenied("this token may read but not write key %q", l.Key)
	case !lk.a.canHold(l.Holder):
		return "", scopeDenied("this token may not act as holder %q", l.Holder)
	}
	return id, nil
}

// session returns the id a scoped request on session id is sent with: id
// itself when the token may act as its holder or no session has that id,
// hiddenID(id) when it may not.
func (lk *lookup) session(id string) (string, error) {
	if !lk.a.holderScoped() {
		return id, nil
	}
	ss, err := lk.s.n.GetSession(lk.ctx, id, true)
	if err == nil && lk.a.canHold(ss.Holder) {
		return id, nil
	}
	if !lk.fresh {
		ss, err = lk.s.n.GetSession(lk.ctx, id, false)
		if err != nil && !isCode(err, wire.CodeSessionNotFound) {
			return "", err
		}
		lk.fresh = true
	}
	if err == nil && !lk.a.canHold(ss.Holder) {
		return hiddenID(id), nil
	}
	return id, nil
}

// sessionView is sess as a scoped token sees it: the ids of the leases it
// may not see are left out of lease_ids. sess must be one the token may
// see.
func (s *core) sessionView(ctx context.Context, a *access, sess *wire.Session) *wire.Session {
	if !a.keyScoped() || sess == nil || len(sess.LeaseIDs) == 0 {
		return sess
	}
	c := *sess
	c.LeaseIDs = make([]string, 0, len(sess.LeaseIDs))
	for _, id := range sess.LeaseIDs {
		// This node's own state: a lease of the session is known
		// wherever the session (as read just before) is.
		if l, err := s.n.GetLease(ctx, id, true); err == nil && a.canRead(l.Key) {
			c.LeaseIDs = append(c.LeaseIDs, id)
		}
	}
	return &c
}

// leaseView is l as a scoped token sees it: the id of its session left
// out when the token may not act as its holder (sessions are their
// holder's: the token cannot see that session). l must be a lease the
// token may see.
func (a *access) leaseView(l *wire.Lease) *wire.Lease {
	if l == nil || l.SessionID == "" || a.canHold(l.Holder) {
		return l
	}
	c := *l
	c.SessionID = ""
	return &c
}

// narrowLeases returns the listing to ask the node for on behalf of a
// token that may read only some keys, and false when no key it may read
// can match req (the answer is then an empty list). The node's answer
// must still be filtered with canRead: the narrowed request may match
// more than the token may read when it reads under several prefixes.
func (a *access) narrowLeases(req wire.ListRequest) (wire.ListRequest, bool) {
	if !a.keyScoped() {
		return req, true
	}
	if req.Key != "" {
		return req, a.canRead(req.Key)
	}
	if a.canRead(req.Prefix) {
		return req, true // every key under req.Prefix is readable
	}
	var under []string
	for _, p := range a.keys.readPrefixes() {
		if strings.HasPrefix(p, req.Prefix) && !slices.Contains(under, p) {
			under = append(under, p)
		}
	}
	if len(under) == 0 {
		return req, false
	}
	// The longest prefix the readable ones under req.Prefix share.
	p := under[0]
	for _, u := range under[1:] {
		for !strings.HasPrefix(u, p) {
			p = p[:len(p)-1]
		}
	}
	req.Prefix = p
	return req, true
}

// narrowSessions returns the holder filter to ask the node for on behalf
// of a token that may act as some holders only, and false when none of
// them can match holder.
func (a *access) narrowSessions(holder string) (string, bool) {
	if !a.holderScoped() {
		return holder, true
	}
	if holder != "" {
		return holder, a.canHold(holder)
	}
	if len(a.holders.names) == 1 && len(a.holders.prefixes) == 0 {
		return a.holders.names[0], true
	}
	return "", true
}

// visibleEvent is ev as a scoped token's stream shows it; ok is false when
// the stream leaves it out: a lease event (or lock_delay_ended) on a key
// it may not read, a session event of a holder it may not act as.
func (s *core) visibleEvent(ctx context.Context, a *access, ev wire.Event) (wire.Event, bool) {
	if a == nil {
		return ev, true
	}
	if ev.Key != "" && !a.canRead(ev.Key) {
		return ev, false
	}
	if ev.Lease != nil {
		if !a.canRead(ev.Lease.Key) {
			return ev, false
		}
		ev.Lease = a.leaseView(ev.Lease)
	}
	if ev.Session != nil {
		if !a.canHold(ev.Session.Holder) {
			return ev, false
		}
		ev.Session = s.sessionView(ctx, a, ev.Session)
	}
	if ev.Key == "" && ev.Lease == nil && ev.Session == nil {
		// Of no key and no holder: nothing a scoped token is shown.
		return ev, false
	}
	return ev, true
}

// scopeAcquire checks an acquire of a scoped token: it must write key, as
// holder when it names one, and the session it binds to must be one it may
// see. It returns the session id to send (hidden when the token may not see
// it).
func (s *core) scopeAcquire(r *http.Request, key, holder, sessionID string) (string, error) {
	a := accessOf(r)
	if a == nil {
		return sessionID, nil
	}
	if !a.canWrite(key) {
		return "", scopeDenied("this token may not write key %q", key)
	}
	if holder != "" && !a.canHold(holder) {
		return "", scopeDenied("this token may not act as holder %q", holder)
	}
	if sessionID == "" {
		return "", nil // a standalone lease: the node refuses it without a holder
	}
	return s.lookup(r.Context(), a, false).session(sessionID)
}

// scopedHeartbeat renews the leases of a bulk heartbeat that a scoped token
// may write. An item on a lease it may not see is sent with a hidden id
// (the node answers it as a missing lease). An item on a lease it sees but
// may not write is sent with a hidden id too, so that it changes nothing
// and the items keep their places (the node's own refusals name items by
// index), and answered 403 PERMISSION_DENIED.
func (s *core) scopedHeartbeat(r *http.Request, items []wire.HeartbeatItem) ([]wire.HeartbeatResult, error) {
	a := accessOf(r)
	if a == nil {
		return s.n.Heartbeat(r.Context(), items)
	}
	lk := s.lookup(r.Context(), a, false)
	ids := make([]string, len(items))
	denied := make([]*wire.Error, len(items))
	send := make([]wire.HeartbeatItem, len(items))
	for i, it := range items {
		ids[i] = it.LeaseID
		sent, err := lk.writeLease(it.LeaseID)
		var we *wire.Error
		switch {
		case errors.As(err, &we) && we.Code == wire.CodePermissionDenied:
			denied[i], sent = we, hiddenID(it.LeaseID)
		case err != nil:
			return nil, err
		}
		it.LeaseID = sent
		send[i] = it
	}
	got, err := s.n.Heartbeat(r.Context(), send)
	if err != nil {
		return nil, err
	}
	if len(got) != len(send) {
		return nil, fmt.Errorf("heartbeat of %d leases answered %d results", len(send), len(got))
	}
	for i := range got {
		switch sent := send[i].LeaseID; {
		case denied[i] != nil:
			got[i] = wire.HeartbeatResult{LeaseID: ids[i], Error: denied[i]}
		case sent != ids[i]:
			got[i].LeaseID = ids[i]
			got[i].Error = unhideError(got[i].Error, sent, ids[i])
		}
	}
	return got, nil
}
