package api

import (
	"errors"
	"net/http"

	"github.com/julienschmidt/httprouter"
)

// clusterStatus handles GET /v1/cluster: this node's view of the cluster.
func (s *server) clusterStatus(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	st, err := s.n.ClusterStatus(r.Context())
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
func (s *server) removeMember(w http.ResponseWriter, r *http.Request, ps httprouter.Params) error {
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
func (s *server) transferLeadership(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
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
