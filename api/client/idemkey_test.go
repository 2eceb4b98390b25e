package client

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/wire"
)

// TestAcquireIdempotencyKeyInBodyNotHeader: the idempotency key travels in
// the JSON body only; no header (which proxies log) carries it.
func TestAcquireIdempotencyKeyInBodyNotHeader(t *testing.T) {
	const key = "idem-secret-7f3a"
	var gotBody string
	var headerErr string
	s, _ := server(t, func(w http.ResponseWriter, r *http.Request) {
		for name, vals := range r.Header {
			if strings.EqualFold(name, "Idempotency-Key") || strings.EqualFold(name, "X-Idempotency-Key") {
				headerErr = "header " + name + " sent"
			}
			for _, v := range vals {
				if strings.Contains(v, key) {
					headerErr = "header " + name + " carries the idempotency key"
				}
			}
		}
		var b struct {
			IdempotencyKey string `json:"idempotency_key"`
		}
		if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
			writeErr(w, http.StatusBadRequest, wire.CodeInvalidArgument, err.Error())
			return
		}
		gotBody = b.IdempotencyKey
		writeJSON(w, http.StatusCreated, wire.Lease{LeaseID: "ls_1", Key: "k", Holder: "h", Token: "tok"})
	})
	c := newClient(t, strings.TrimPrefix(s.URL, "http://"))
	if _, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: "k", Holder: "h", TTLMS: 1000, IdempotencyKey: key}); err != nil {
		t.Fatal(err)
	}
	if headerErr != "" {
		t.Fatal(headerErr)
	}
	if gotBody != key {
		t.Fatalf("body idempotency_key %q, want %q", gotBody, key)
	}
}
