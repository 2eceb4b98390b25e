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

// plainASCII reports whether s is printable ASCII that encoding/json
// writes as is (no '"', '\\', '<', '>', '&').
func plainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendRenewalLine appends r as encoding/json encodes it; false (nothing
// that counts appended) for a renewal with metadata or a string that
// needs escaping.
func appendRenewalLine(b []byte, r wire.KeepAliveRenewal) ([]byte, bool) {
	if r.Metadata != nil || !plainASCII(r.LeaseID) || !plainASCII(r.Token) {
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
	i := 0
	next := func(c byte) bool {
		if i < len(line) && line[i] == c {
			i++
			return true
		}
		return false
	}
	raw := func() ([]byte, bool) {
		if !next('"') {
			return nil, false
		}
		start := i
		for ; i < len(line); i++ {
			c := line[i]
			if c == '"' {
				s := line[start:i]
				i++
				return s, true
			}
			if c < 0x20 || c > 0x7e || c == '\\' {
				return nil, false
			}
		}
		return nil, false
	}
	// str is raw's string (a key is compared as raw bytes, without one).
	str := func() (string, bool) {
		b, ok := raw()
		return string(b), ok
	}
	num := func() (uint64, bool) {
		start := i
		var n uint64
		for ; i < len(line) && line[i] >= '0' && line[i] <= '9'; i++ {
			n = n*10 + uint64(line[i]-'0')
		}
		d := i - start
		if d == 0 || d > 18 || (d > 1 && line[start] == '0') {
			return 0, false
		}
		return n, true
	}
	if !next('{') {
		return false
	}
	for {
		key, ok := raw()
		if !ok || !next(':') {
			return false
		}
		var f int
		var n uint64
		switch string(key) {
		case "id", "fencing_token", "ttl_ms", "remaining_ms", "renewal_count", "status":
			if n, ok = num(); !ok {
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
			if r.LeaseID, ok = str(); !ok {
				return false
			}
		case "ok":
			f = 7
			switch {
			case i+4 <= len(line) && string(line[i:i+4]) == "true":
				r.OK, i = true, i+4
			case i+5 <= len(line) && string(line[i:i+5]) == "false":
				r.OK, i = false, i+5
			default:
				return false
			}
		case "expires_at":
			f = 8
			s, ok := str()
			if !ok {
				return false
			}
			t, err := time.Parse(time.RFC3339Nano, s)
			var buf [48]byte
			if err != nil || string(t.AppendFormat(buf[:0], time.RFC3339Nano)) != s {
				return false
			}
			r.ExpiresAt = &t
		default:
			return false
		}
		if seen[f] {
			return false
		}
		seen[f] = true
		if next('}') {
			if i != len(line) {
				return false
			}
			*a = r
			return true
		}
		if !next(',') {
			return false
		}
	}
}
