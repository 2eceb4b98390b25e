package api

import (
	"net/http"
	"net/url"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// Lease groups: several keys at once, all or nothing (node.AcquireGroup).

// groupAcquireBody is the body of POST /v1/groups.
type groupAcquireBody struct {
	Keys           []groupKeyBody    `json:"keys"`
	Holder         string            `json:"holder"`
	TTLMS          int64             `json:"ttl_ms"`
	SessionID      string            `json:"session_id"`
	Metadata       map[string]string `json:"metadata"`
	IdempotencyKey string            `json:"idempotency_key"`
	WaitMS         int64             `json:"wait_ms"`
	LockDelayMS    int64             `json:"lock_delay_ms"`
}

type groupKeyBody struct {
	Key   string `json:"key"`
	Limit uint32 `json:"limit"`
}

// acquireGroup handles POST /v1/groups: 201 with the granted group (its
// leases, one per key, and its token), 200 with the same group on an
// idempotent replay.
func (s *groupAPI) acquireGroup(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b groupAcquireBody
	if err := s.decodeBody(w, r, &b, false); err != nil {
		return err
	}
	// A scoped token must write every key, as the holder it names; the
	// session it binds to must be one it may see (scopeAcquire's checks).
	sessionID := b.SessionID
	for i, k := range b.Keys {
		sid := ""
		if i == 0 {
			sid = b.SessionID
		}
		sent, err := s.scopeAcquire(r, k.Key, b.Holder, sid)
		if err != nil {
			return err
		}
		if i == 0 {
			sessionID = sent
		}
	}
	s.waitDeadline(w, b.WaitMS)
	req := wire.GroupAcquireRequest{
		Keys:           make([]wire.GroupKey, len(b.Keys)),
		Holder:         b.Holder,
		TTLMS:          b.TTLMS,
		SessionID:      sessionID,
		SessionToken:   r.Header.Get(headerSessionToken),
		Metadata:       b.Metadata,
		IdempotencyKey: b.IdempotencyKey,
		WaitMS:         b.WaitMS,
		LockDelayMS:    b.LockDelayMS,
	}
	for i, k := range b.Keys {
		req.Keys[i] = wire.GroupKey{Key: k.Key, Limit: k.Limit}
	}
	g, replayed, err := s.n.AcquireGroup(r.Context(), req)
	if err != nil {
		return unhide(err, sessionID, b.SessionID)
	}
	writeCreated(w, replayed, "/v1/groups/"+url.PathEscape(g.GroupID), g)
	return nil
}

// getGroup handles GET /v1/groups/:id[?stale=true].
func (s *groupAPI) getGroup(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	stale, err := staleParam(r)
	if err != nil {
		return err
	}
	id := ps.ByName("id")
	g, err := s.n.GetGroup(r.Context(), id, stale)
	if err != nil {
		return err
	}
	a := accessOf(r)
	if !a.canReadGroup(g) {
		return groupNotFound(id)
	}
	writeJSON(w, http.StatusOK, a.groupView(g))
	return nil
}

// renewGroup handles POST /v1/groups/:id/renew: header X-Lease-Token (the
// group's token), optional body {"ttl_ms"}.
func (s *groupAPI) renewGroup(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	var b struct {
		TTLMS int64 `json:"ttl_ms"`
	}
	tw, err := s.startRenew(w, r, ps, groupTarget, &b)
	if err != nil {
		return err
	}
	g, err := s.n.RenewGroup(r.Context(), wire.GroupRenewRequest{GroupID: tw.sent, Token: tw.token, TTLMS: b.TTLMS})
	return tw.answer(w, g, err)
}

// releaseGroup handles DELETE /v1/groups/:id: header X-Lease-Token (or
// X-Session-Token for a group bound to a session), optional reason.
func (s *groupAPI) releaseGroup(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	tw, err := s.startRelease(w, r, ps, groupTarget)
	if err != nil {
		return err
	}
	g, err := s.n.ReleaseGroup(r.Context(), wire.GroupReleaseRequest{GroupID: tw.sent, Token: tw.token,
		SessionToken: tw.sessionToken, Reason: tw.reason})
	return tw.answer(w, g, err)
}

// Scoped tokens (scoped.go's policy): a lease group one of whose keys a
// token may not read does not exist for it (404 as for a missing group,
// and a write on it is sent on with a hidden id); a write on a group the
// token sees but may not write (a key only readable, another holder) is
// 403.

// groupNotFound is what the node answers a read of a group id no group
// has (node.Node.GetGroup).
func groupNotFound(id string) *wire.Error {
	return &wire.Error{Code: wire.CodeLeaseNotFound, Message: "lease group " + id + " not found"}
}

// canReadGroup reports whether the token may see g: every key of it.
func (a *access) canReadGroup(g *wire.LeaseGroup) bool {
	for _, l := range g.Leases {
		if !a.canRead(l.Key) {
			return false
		}
	}
	return true
}

// groupView is g as a token that may see it sees it: the session's id
// left out when it may not act as the holder (leaseView).
func (a *access) groupView(g *wire.LeaseGroup) *wire.LeaseGroup {
	if a == nil || g.SessionID == "" || a.canHold(g.Holder) {
		return g
	}
	c := *g
	c.SessionID = ""
	c.Leases = make([]*wire.Lease, len(g.Leases))
	for i, l := range g.Leases {
		c.Leases[i] = a.leaseView(l)
	}
	return &c
}

// group returns the lease group named id if the token may see it, as
// lookup.lease does for a lease.
func (lk *lookup) group(id string) (*wire.LeaseGroup, bool, error) {
	return lookupVisible(lk, id, lk.s.n.GetGroup, lk.a.canReadGroup)
}

// writeGroup is writeLease for a lease group: the id a scoped write on
// group id is sent with, or a 403.
func (lk *lookup) writeGroup(id string) (string, error) {
	if lk.a == nil {
		return id, nil
	}
	g, hidden, err := lk.group(id)
	switch {
	case err != nil:
		return "", err
	case hidden:
		return hiddenID(id), nil
	case g == nil:
		return id, nil
	case !lk.a.canHold(g.Holder):
		return "", scopeDenied("this token may not act as holder %q", g.Holder)
	}
	for _, l := range g.Leases {
		if !lk.a.canWrite(l.Key) {
			return "", scopeDenied("this token may read but not write key %q", l.Key)
		}
	}
	return id, nil
}
