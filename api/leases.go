package api

import (
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// acquireBody is the body of POST /v1/leases.
type acquireBody struct {
	Key            string            `json:"key"`
	Holder         string            `json:"holder"`
	TTLMS          int64             `json:"ttl_ms"`
	SessionID      string            `json:"session_id"`
	Limit          uint32            `json:"limit"`
	Metadata       map[string]string `json:"metadata"`
	IdempotencyKey string            `json:"idempotency_key"`
	WaitMS         int64             `json:"wait_ms"`
	LockDelayMS    int64             `json:"lock_delay_ms"`
	Grant          bool              `json:"grant"`
}

// acquire handles POST /v1/leases: 201 with the granted lease and its token,
// 200 with the same lease on an idempotent replay.
func (s *leaseAPI) acquire(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b acquireBody
	if err := s.decodeBody(w, r, &b, false); err != nil {
		return err
	}
	sessionID, err := s.scopeAcquire(r, b.Key, b.Holder, b.SessionID)
	if err != nil {
		return err
	}
	s.waitDeadline(w, b.WaitMS)
	lease, replayed, err := s.n.Acquire(r.Context(), wire.AcquireRequest{
		Key:            b.Key,
		Holder:         b.Holder,
		TTLMS:          b.TTLMS,
		SessionID:      sessionID,
		SessionToken:   r.Header.Get(headerSessionToken),
		Limit:          b.Limit,
		Metadata:       b.Metadata,
		IdempotencyKey: b.IdempotencyKey,
		WaitMS:         b.WaitMS,
		LockDelayMS:    b.LockDelayMS,
		Grant:          b.Grant,
	})
	if err != nil {
		return unhide(err, sessionID, b.SessionID)
	}
	writeCreated(w, replayed, "/v1/leases/"+url.PathEscape(lease.LeaseID), lease)
	return nil
}

// waitDeadline gives the answer of an acquire that may wait waitMS (a
// lease's or a lease group's) its write deadline: the wait on top of the
// usual bound (the node refuses more than its MaxWait).
func (s *core) waitDeadline(w http.ResponseWriter, waitMS int64) {
	s.writeDeadline(w, time.Duration(min(max(waitMS, 0), 24*3600*1000))*time.Millisecond)
	decideDeadline(w)
}

// writeCreated answers a create: 201 with the new resource's Location, or
// 200 for an idempotent replay of one made before.
func writeCreated(w http.ResponseWriter, replayed bool, location string, v any) {
	status := http.StatusCreated
	if replayed {
		status = http.StatusOK
	}
	w.Header().Set("Location", location)
	writeJSON(w, status, v)
}

// getLease handles GET /v1/leases/:id[?stale=true]; with X-Lease-Token (or
// X-Session-Token) the holder's read with a grant (grants.go).
func (s *leaseAPI) getLease(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	stale, err := staleParam(r)
	if err != nil {
		return err
	}
	if tok, stok := r.Header.Get(headerLeaseToken), r.Header.Get(headerSessionToken); tok != "" || stok != "" {
		// The holder's GET with its grant: only for a lease the token may
		// write and act as holder of; another's answers as a missing one.
		id := ps.ByName("id")
		sent, err := s.lookup(r.Context(), accessOf(r), stale).writeLease(id)
		if err != nil {
			return err
		}
		return unhide(s.getLeaseGrant(w, r, wire.GrantRequest{LeaseID: sent, Token: tok, SessionToken: stok}, stale), sent, id)
	}
	lease, err := s.n.GetLease(r.Context(), ps.ByName("id"), stale)
	if err != nil {
		return err
	}
	a := accessOf(r)
	if !a.canRead(lease.Key) {
		return leaseNotFound(ps.ByName("id"))
	}
	writeJSON(w, http.StatusOK, a.leaseView(lease))
	return nil
}

// staleParam reads the one query parameter of a GET of one lease or lease
// group: ?stale=true, a read this node answers from its own state.
func staleParam(r *http.Request) (bool, error) {
	q := newQuery(r)
	stale := q.stale()
	return stale, q.check()
}

// listLeases handles GET /v1/leases with the filters key, prefix, holder,
// session_id, state, the page size limit and the cursor after.
func (s *leaseAPI) listLeases(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	req := wire.ListRequest{
		Key:       q.str("key"),
		Prefix:    q.str("prefix"),
		Holder:    q.str("holder"),
		SessionID: q.str("session_id"),
		State:     q.str("state"),
		After:     q.str("after"),
		Limit:     q.limit(),
	}
	stale := q.stale()
	if err := q.check(); err != nil {
		return err
	}
	a := accessOf(r)
	if req.SessionID != "" {
		// A session the token may not see has no leases for it.
		sent, err := s.lookup(r.Context(), a, stale).session(req.SessionID)
		if err != nil {
			return err
		}
		req.SessionID = sent
	}
	req, some := a.narrowLeases(req)
	if !some {
		// No key the token may read can match: ask for a key no lease
		// has, so that the node still checks the request (a bad state or
		// limit is refused as for anyone) and answers an empty list.
		req.Key, req.Prefix = "\x00", ""
	}
	list, err := s.n.ListLeases(r.Context(), req, stale)
	if err != nil {
		return err
	}
	out := *list
	if a != nil {
		out.Leases = make([]*wire.Lease, 0, len(list.Leases))
		for _, l := range list.Leases {
			if a.canRead(l.Key) {
				out.Leases = append(out.Leases, a.leaseView(l))
			}
		}
	}
	if out.Leases == nil {
		out.Leases = []*wire.Lease{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// renewBody is the optional body of POST /v1/leases/:id/renew.
type renewBody struct {
	TTLMS    int64             `json:"ttl_ms"`
	Metadata map[string]string `json:"metadata"`
	Grant    bool              `json:"grant"`
}

// renew handles POST /v1/leases/:id/renew: header X-Lease-Token, optional
// body {"ttl_ms", "metadata"} (ttl_ms absent: keep the lease's TTL;
// metadata absent or null: keep its metadata; {}: clear it).
func (s *leaseAPI) renew(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	// Most renewals have no body: a body's fields are decoded into one
	// made for it (decodeBody does not touch v without a body).
	var bp *renewBody
	if r.Body != nil && r.Body != http.NoBody {
		bp = new(renewBody)
	}
	tw, err := s.startRenew(w, r, ps, leaseTarget, bp)
	if err != nil {
		return err
	}
	var b renewBody
	if bp != nil {
		b = *bp
	}
	lease, err := s.n.Renew(r.Context(), wire.RenewRequest{LeaseID: tw.sent, Token: tw.token, TTLMS: b.TTLMS, Metadata: b.Metadata, Grant: b.Grant})
	return tw.answer(w, lease, err)
}

// target is what a write by token names: a lease, or a lease group, whose
// handlers (groups.go) share the single lease's code through it.
type target struct {
	// tokenNote follows "header X-Lease-Token" where renewing without
	// it is refused; name is the target in release's refusal.
	tokenNote, name string
	// writeID is the id a scoped token's write is sent with, or a 403
	// (lookup.writeLease, lookup.writeGroup).
	writeID func(lk *lookup, id string) (string, error)
}

var (
	leaseTarget = target{tokenNote: "", name: "lease", writeID: (*lookup).writeLease}
	groupTarget = target{tokenNote: " (the lease group's token)", name: "lease group", writeID: (*lookup).writeGroup}
)

// tokenWrite is a renewal or release of one lease or lease group by its
// token, as startRenew and startRelease begin it.
type tokenWrite struct {
	token, sessionToken string
	// reason is a release's optional reason.
	reason string
	// id is the id of the path; sent the one the node is asked about (a
	// hidden id when a scoped token may not see the target).
	id, sent string
}

// startRenew begins a renewal: X-Lease-Token is required, the optional
// body is decoded into b, and the id is the one the token's write is sent
// with.
func (s *core) startRenew(w http.ResponseWriter, r *http.Request, ps httprouter.Params, t target, b any) (tokenWrite, error) {
	tw := tokenWrite{token: r.Header.Get(headerLeaseToken)}
	if tw.token == "" {
		return tw, missingHeader(headerLeaseToken, t.tokenNote)
	}
	if err := s.decodeBody(w, r, b, true); err != nil && !errors.Is(err, errNoBody) {
		return tw, err
	}
	return tw, s.sendID(r, ps, t, &tw)
}

// startRelease begins a release: X-Lease-Token, or X-Session-Token for a
// target bound to a session, the optional reason, and the id the token's
// write is sent with.
func (s *core) startRelease(w http.ResponseWriter, r *http.Request, ps httprouter.Params, t target) (tokenWrite, error) {
	tw := tokenWrite{token: r.Header.Get(headerLeaseToken), sessionToken: r.Header.Get(headerSessionToken)}
	if tw.token == "" && tw.sessionToken == "" {
		return tw, missingHeader(headerLeaseToken, " (or "+headerSessionToken+" for a "+t.name+" bound to a session)")
	}
	var err error
	if tw.reason, err = s.reason(w, r); err != nil {
		return tw, err
	}
	return tw, s.sendID(r, ps, t, &tw)
}

// sendID sets tw's id from the path and the id the write is sent with.
func (s *core) sendID(r *http.Request, ps httprouter.Params, t target, tw *tokenWrite) error {
	tw.id = ps.ByName("id")
	a := accessOf(r)
	if a == nil {
		// Not a scoped token's: the id is sent as it is (writeLease,
		// writeGroup), without a lookup to make.
		tw.sent = tw.id
		return nil
	}
	var err error
	tw.sent, err = t.writeID(s.lookup(r.Context(), a, false), tw.id)
	return err
}

// answer answers the node's outcome of tw: 200 with v, or the node's
// refusal, a hidden id in it answered as for the id of the path (unhide).
func (tw *tokenWrite) answer(w http.ResponseWriter, v any, err error) error {
	if err != nil {
		return unhide(err, tw.sent, tw.id)
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// reasonBody is the optional body of release, revoke and holder release.
type reasonBody struct {
	Reason string `json:"reason"`
}

// reason reads the optional {"reason"} body, falling back to ?reason=.
func (s *core) reason(w http.ResponseWriter, r *http.Request) (string, error) {
	if r.Body != nil && r.Body != http.NoBody {
		// Without a body (the usual release), nothing to decode into.
		b := new(reasonBody)
		if err := s.decodeBody(w, r, b, true); err != nil && !errors.Is(err, errNoBody) {
			return "", err
		}
		if b.Reason != "" {
			return b.Reason, nil
		}
	}
	if r.URL.RawQuery == "" {
		return "", nil // nothing in the query either
	}
	q := newQuery(r)
	return q.str("reason"), q.check()
}

// release handles DELETE /v1/leases/:id: header X-Lease-Token (or
// X-Session-Token for a lease bound to a session), optional reason.
func (s *leaseAPI) release(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	tw, err := s.startRelease(w, r, ps, leaseTarget)
	if err != nil {
		return err
	}
	lease, err := s.n.Release(r.Context(), wire.ReleaseRequest{
		LeaseID:      tw.sent,
		Token:        tw.token,
		SessionToken: tw.sessionToken,
		Reason:       tw.reason,
	})
	return tw.answer(w, lease, err)
}

// revoke handles POST /v1/leases/:id/revoke (admin): optional reason.
func (s *leaseAPI) revoke(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	reason, err := s.reason(w, r)
	if err != nil {
		return err
	}
	lease, err := s.n.Revoke(r.Context(), ps.ByName("id"), reason)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, lease)
	return nil
}

// heartbeatBody is the body of POST /v1/heartbeat.
type heartbeatBody struct {
	Leases []heartbeatItem `json:"leases"`
}

type heartbeatItem struct {
	LeaseID  string            `json:"lease_id"`
	Token    string            `json:"token"`
	Metadata map[string]string `json:"metadata"`
}

// heartbeatAnswer is the answer of POST /v1/heartbeat: one result per item,
// in request order.
type heartbeatAnswer struct {
	Results []wire.HeartbeatResult `json:"results"`
}

// heartbeat handles POST /v1/heartbeat: 200 with per-item results even when
// some items failed.
func (s *leaseAPI) heartbeat(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b heartbeatBody
	if err := s.decodeBody(w, r, &b, false); err != nil {
		return err
	}
	items := make([]wire.HeartbeatItem, len(b.Leases))
	for i, it := range b.Leases {
		items[i] = wire.HeartbeatItem{LeaseID: it.LeaseID, Token: it.Token, Metadata: it.Metadata}
	}
	results, err := s.scopedHeartbeat(r, items)
	if err != nil {
		return err
	}
	if results == nil {
		results = []wire.HeartbeatResult{}
	}
	for i := range results {
		if e := results[i].Error; e != nil && statusFor(e.Code) == http.StatusInternalServerError {
			s.logFailure(r, w, e)
			results[i].Error = internalError()
		}
	}
	writeJSON(w, http.StatusOK, heartbeatAnswer{Results: results})
	return nil
}

// validateBody is the body of POST /v1/validate.
type validateBody struct {
	Key          string `json:"key"`
	FencingToken uint64 `json:"fencing_token"`
	LeaseID      string `json:"lease_id"`
	Token        string `json:"token"`
}

// validate handles POST /v1/validate: {"key", "fencing_token"} or
// {"lease_id", "token"} -> {"valid", "reason", "current"}.
func (s *leaseAPI) validate(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b validateBody
	if err := s.decodeBody(w, r, &b, false); err != nil {
		return err
	}
	a := accessOf(r)
	if b.Key != "" && !a.canRead(b.Key) {
		return scopeDenied("this token may not read key %q", b.Key)
	}
	res, err := s.n.Validate(r.Context(), wire.ValidateRequest{
		Key:          b.Key,
		FencingToken: b.FencingToken,
		LeaseID:      b.LeaseID,
		Token:        b.Token,
	})
	if err != nil {
		return err
	}
	if res.Current != nil {
		if !a.canRead(res.Current.Key) {
			// As for a lease id no lease has (node.Node.Validate).
			res = &wire.ValidateResult{Valid: false, Reason: "not_found"}
		} else {
			res.Current = a.leaseView(res.Current)
		}
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// missingHeader is the 400 for a required token header that is absent.
func missingHeader(name, alt string) *wire.Error {
	return &wire.Error{Code: wire.CodeInvalidArgument, Field: name,
		Message: "header " + name + alt + " is required"}
}
