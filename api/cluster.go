package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// clusterStatus handles GET /v1/cluster: this node's view of the cluster.
func (s *clusterAPI) clusterStatus(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	stale := q.stale()
	if err := q.check(); err != nil {
		return err
	}
	st, err := s.n.ClusterStatus(r.Context(), stale)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// memberAnswer is the answer of the membership routes.
type memberAnswer struct {
	ID      string `json:"id,omitempty"`
	Removed bool   `json:"removed,omitempty"`
	// Transferred reports that leadership transfer was started towards ID
	// (any voter when ID is empty).
	Transferred bool `json:"transferred,omitempty"`
}

// removeMember handles DELETE /v1/cluster/members/:id (admin).
func (s *clusterAPI) removeMember(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
	id := ps.ByName("id")
	if err := s.n.RemoveMember(r.Context(), id); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, memberAnswer{ID: id, Removed: true})
	return nil
}

// transferBody is the optional body of POST /v1/cluster/transfer-leadership.
type transferBody struct {
	// ID names the voter to hand leadership to; empty means any.
	ID string `json:"id"`
}

// transferLeadership handles POST /v1/cluster/transfer-leadership (admin):
// optional body {"id"}; no body or no id hands leadership to any voter.
func (s *clusterAPI) transferLeadership(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	var b transferBody
	if err := s.decodeBody(w, r, &b, true); err != nil && !errors.Is(err, errNoBody) {
		return err
	}
	if err := s.n.TransferLeadership(r.Context(), b.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, memberAnswer{ID: b.ID, Transferred: true})
	return nil
}

// Bounds of GET /v1/cluster/local?timeout_ms=.
const (
	defaultLocalTimeout = 10 * time.Second
	maxLocalTimeout     = 60 * time.Second
)

// localState handles GET /v1/cluster/local (admin, never forwarded): this
// node's own view, and with ?hash_at=N the hash of its state right after
// it applied index N, waiting up to ?timeout_ms= (default 10 s) for it.
func (s *clusterAPI) localState(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := r.URL.Query()
	var hashAt uint64
	if v := q.Get("hash_at"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return &wire.Error{Code: wire.CodeInvalidArgument, Field: "hash_at", Message: "hash_at must be a log index (a positive integer)"}
		}
		hashAt = n
	}
	timeout := defaultLocalTimeout
	if v := q.Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return &wire.Error{Code: wire.CodeInvalidArgument, Field: "timeout_ms",
				Message: "timeout_ms must be an integer of milliseconds"}
		}
		if ms < 1 || ms > maxLocalTimeout.Milliseconds() {
			return wire.OutOfRange("timeout_ms", 1, maxLocalTimeout.Milliseconds(), ms, "")
		}
		timeout = time.Duration(ms) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	st, err := s.n.LocalState(ctx, hashAt)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}
