package api

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// sessionBody is the body of POST /v1/sessions.
type sessionBody struct {
	Holder   string            `json:"holder"`
	TTLMS    int64             `json:"ttl_ms"`
	Metadata map[string]string `json:"metadata"`
}

// createSession handles POST /v1/sessions: 201 with the session and its
// token.
func (s *sessionAPI) createSession(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b sessionBody
	if err := s.decodeBody(w, r, &b, false); err != nil {
		return err
	}
	if !accessOf(r).canHold(b.Holder) {
		return scopeDenied("this token may not act as holder %q", b.Holder)
	}
	sess, err := s.n.CreateSession(r.Context(), wire.SessionRequest{
		Holder:   b.Holder,
		TTLMS:    b.TTLMS,
		Metadata: b.Metadata,
	})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/sessions/"+url.PathEscape(sess.SessionID))
	writeJSON(w, http.StatusCreated, sess)
	return nil
}

// getSession handles GET /v1/sessions/:id[?stale=true].
func (s *sessionAPI) getSession(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	q := newQuery(r)
	stale := q.stale()
	if err := q.check(); err != nil {
		return err
	}
	sess, err := s.n.GetSession(r.Context(), ps.ByName("id"), stale)
	if err != nil {
		return err
	}
	a := accessOf(r)
	if !a.canHold(sess.Holder) {
		return sessionNotFound(ps.ByName("id"))
	}
	writeJSON(w, http.StatusOK, s.sessionView(r.Context(), a, sess))
	return nil
}

// listSessions handles GET /v1/sessions with the filter holder, the page
// size limit and the cursor after.
func (s *sessionAPI) listSessions(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	holder, after, limit, stale := q.str("holder"), q.str("after"), q.limit(), q.stale()
	if err := q.check(); err != nil {
		return err
	}
	a := accessOf(r)
	holder, some := a.narrowSessions(holder)
	if !some {
		// No holder the token may act as can match: ask for a holder no
		// session has, so that the node still checks the request.
		holder = "\x00"
	}
	list, err := s.n.ListSessions(r.Context(), holder, after, limit, stale)
	if err != nil {
		return err
	}
	out := *list
	if a != nil {
		out.Sessions = make([]*wire.Session, 0, len(list.Sessions))
		for _, ss := range list.Sessions {
			if a.canHold(ss.Holder) {
				out.Sessions = append(out.Sessions, s.sessionView(r.Context(), a, ss))
			}
		}
	}
	if out.Sessions == nil {
		out.Sessions = []*wire.Session{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sessionHeartbeatBody is the optional body of POST
// /v1/sessions/:id/heartbeat.
type sessionHeartbeatBody struct {
	// Metadata, if present and not null, replaces the session's metadata
	// with the heartbeat: a worker's statistics ({} clears it).
	Metadata map[string]string `json:"metadata"`
}

// sessionHeartbeat handles POST /v1/sessions/:id/heartbeat (header
// X-Session-Token; optional body {"metadata"}).
func (s *sessionAPI) sessionHeartbeat(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	token := r.Header.Get(headerSessionToken)
	if token == "" {
		return missingHeader(headerSessionToken, "")
	}
	var b sessionHeartbeatBody
	if err := s.decodeBody(w, r, &b, true); err != nil && !errors.Is(err, errNoBody) {
		return err
	}
	id := ps.ByName("id")
	a := accessOf(r)
	sent, err := s.lookup(r.Context(), a, false).session(id)
	if err != nil {
		return err
	}
	sess, err := s.n.SessionHeartbeat(r.Context(), wire.SessionHeartbeatRequest{SessionID: sent, Token: token, Metadata: b.Metadata})
	if err != nil {
		return unhide(err, sent, id)
	}
	writeJSON(w, http.StatusOK, s.sessionView(r.Context(), a, sess))
	return nil
}

// endSession handles DELETE /v1/sessions/:id. With X-Session-Token the
// holder ends its session; without it an admin forces the end. Either way
// every lease of the session ends with reason "session_ended".
func (s *sessionAPI) endSession(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	token := r.Header.Get(headerSessionToken)
	id := ps.ByName("id")
	a := accessOf(r) // nil without a session token: an admin's
	sent, err := s.lookup(r.Context(), a, false).session(id)
	if err != nil {
		return err
	}
	sess, err := s.n.EndSession(r.Context(), sent, token, token == "")
	if err != nil {
		return unhide(err, sent, id)
	}
	writeJSON(w, http.StatusOK, s.sessionView(r.Context(), a, sess))
	return nil
}

// holderReleaseAnswer is the answer of POST /v1/holders/:holder/release.
type holderReleaseAnswer struct {
	Holder string `json:"holder"`
	// Released counts the leases and sessions that were ended.
	Released int `json:"released"`
}

// releaseHolder handles POST /v1/holders/:holder/release (admin, or a
// write token restricted to holders that include this one): ends every
// lease and session of the holder, whatever their keys; optional reason.
func (s *sessionAPI) releaseHolder(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	holder := ps.ByName("holder")
	if !accessOf(r).canHold(holder) {
		return scopeDenied("this token may not act as holder %q", holder)
	}
	reason, err := s.reason(w, r)
	if err != nil {
		return err
	}
	n, err := s.n.ReleaseHolder(r.Context(), holder, reason)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, holderReleaseAnswer{Holder: holder, Released: n})
	return nil
}
