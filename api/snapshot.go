package api

import (
	"errors"
	"io"
	"net/http"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/wire"
)

// MaxSnapshotBytes limits the body of PUT /v1/cluster/snapshot. The
// contract's 64 KiB limit is for JSON bodies; a snapshot file holds the
// whole state.
const MaxSnapshotBytes = 4 << 30

// saveSnapshot handles GET /v1/cluster/snapshot (admin): the leader streams
// a snapshot file of the whole state (application/octet-stream). An error
// before the file starts is an ordinary error answer; one after it cuts the
// connection, so that a partial file never looks complete (the file's
// header carries its size and checksum as well).
func (s *clusterAPI) saveSnapshot(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	sw := &snapshotWriter{w: w}
	if _, err := s.n.SaveSnapshot(r.Context(), sw); err != nil {
		if !sw.started {
			return err
		}
		s.logFailure(r, w, err)
		panic(http.ErrAbortHandler)
	}
	return nil
}

// snapshotWriter sets the headers of the file answer on its first write.
type snapshotWriter struct {
	w       http.ResponseWriter
	started bool
}

func (sw *snapshotWriter) Write(p []byte) (int, error) {
	if !sw.started {
		sw.started = true
		h := sw.w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Disposition", `attachment; filename="leasehold.snapshot"`)
		h.Set("Cache-Control", "no-store")
		sw.w.WriteHeader(http.StatusOK)
	}
	return sw.w.Write(p)
}

// restoreSnapshot handles PUT /v1/cluster/snapshot (admin): the body is a
// snapshot file (at most MaxSnapshotBytes); the leader verifies it whole,
// then replaces the cluster state with it and answers with its description.
// ?fence_floor=N: the restored tokens start above N (wire.RestoreOptions).
func (s *clusterAPI) restoreSnapshot(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	q := newQuery(r)
	opts := wire.RestoreOptions{FenceFloor: q.integer("fence_floor")}
	if q.err != nil {
		return q.err
	}
	body := http.MaxBytesReader(w, r.Body, MaxSnapshotBytes)
	info, err := s.n.RestoreSnapshotWith(r.Context(), body, opts)
	if errors.Is(err, errBodyTimeout) {
		err = &wire.Error{Code: wire.CodeInvalidArgument, Message: "snapshot upload stalled: " + err.Error()}
	}
	if err != nil {
		// Drain a little so that a small refused upload gets its answer
		// rather than a reset connection.
		_, _ = io.CopyN(io.Discard, body, 1<<20)
		return err
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}
