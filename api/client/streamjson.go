package client

import (
	"strconv"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// The keep-alive stream's usual lines, written and read without
// reflection: a renewal costs the client a few microseconds less, on the
// same cores as the server for a program next to it. Anything out of the
// ordinary goes to encoding/json, which the fast paths agree with
// (TestStreamJSONIsEncodingJSONs).

// appendRenewalLine appends r as encoding/json encodes it; false (nothing
// that counts appended) for a renewal with metadata or a string that
// needs escaping.
func appendRenewalLine(b []byte, r wire.KeepAliveRenewal) ([]byte, bool) {
	if r.Metadata != nil || !wire.PlainJSONString(r.LeaseID) || !wire.PlainJSONString(r.Token) {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, r.ID, 10)
	b = append(b, `,"lease_id":"`...)
	b = append(b, r.LeaseID...)
	b = append(b, `","token":"`...)
	b = append(b, r.Token...)
	b = append(b, '"')
	if r.TTLMS != 0 {
		b = append(b, `,"ttl_ms":`...)
		b = strconv.AppendInt(b, r.TTLMS, 10)
	}
	return append(b, '}'), true
}

// parseAnswerLine reads an answer of a committed renewal as the server
// writes it (fields of KeepAliveAnswer other than error, no white space,
// strings of printable ASCII without escapes, plain non-negative integers,
// expires_at in RFC 3339 as Go writes it) into a; false for anything else,
// which the caller reads with encoding/json.
func parseAnswerLine(line []byte, a *wire.KeepAliveAnswer) bool {
	var r wire.KeepAliveAnswer
	var seen [9]bool
	if !wire.ScanFlatLine(line, func(key []byte, v *wire.FlatValue) bool {
		var f int
		var ok bool
		var n uint64
		switch string(key) {
		case "id", "fencing_token", "ttl_ms", "remaining_ms", "renewal_count", "status":
			if n, ok = v.Uint(); !ok {
				return false
			}
			switch string(key) {
			case "id":
				f, r.ID = 0, n
			case "fencing_token":
				f, r.FencingToken = 1, n
			case "ttl_ms":
				f, r.TTLMS = 2, int64(n)
			case "remaining_ms":
				f, r.RemainingMS = 3, int64(n)
			case "renewal_count":
				if n > 1<<32-1 {
					return false
				}
				f, r.RenewalCount = 4, uint32(n)
			case "status":
				if n > 1<<31-1 {
					return false
				}
				f, r.Status = 5, int(n)
			}
		case "lease_id":
			f = 6
			r.LeaseID, ok = v.String()
		case "ok":
			f = 7
			r.OK, ok = v.Bool()
		case "expires_at":
			f = 8
			var s string
			if s, ok = v.String(); !ok {
				return false
			}
			t, err := time.Parse(time.RFC3339Nano, s)
			var buf [48]byte
			if err != nil || string(t.AppendFormat(buf[:0], time.RFC3339Nano)) != s {
				return false
			}
			r.ExpiresAt = &t
		}
		if !ok || seen[f] {
			return false
		}
		seen[f] = true
		return true
	}) {
		return false
	}
	*a = r
	return true
}
