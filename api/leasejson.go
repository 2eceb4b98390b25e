package api

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// appendLeaseJSON appends l as encoding/json encodes it (the same bytes:
// field order, omitempty, escaping, RFC 3339 times), without reflection: a
// lease is the answer of every acquire, renew and release. ok is false
// (nothing appended that counts) when a value is one encoding/json would
// refuse (a time it cannot write as RFC 3339): the caller then encodes
// with encoding/json, which reports it.
func appendLeaseJSON(b []byte, l *wire.Lease) (_ []byte, ok bool) {
	if l == nil {
		return append(b, "null"...), true
	}
	b = append(b, `{"lease_id":`...)
	b = appendJSONString(b, l.LeaseID)
	b = append(b, `,"key":`...)
	b = appendJSONString(b, l.Key)
	b = append(b, `,"holder":`...)
	b = appendJSONString(b, l.Holder)
	b = append(b, `,"limit":`...)
	b = strconv.AppendUint(b, uint64(l.Limit), 10)
	if l.SessionID != "" {
		b = append(b, `,"session_id":`...)
		b = appendJSONString(b, l.SessionID)
	}
	if l.GroupID != "" {
		b = append(b, `,"group_id":`...)
		b = appendJSONString(b, l.GroupID)
	}
	b = append(b, `,"state":`...)
	b = appendJSONString(b, l.State)
	b = append(b, `,"fencing_token":`...)
	b = strconv.AppendUint(b, l.FencingToken, 10)
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, l.TTLMS, 10)
	b = append(b, `,"remaining_ms":`...)
	b = strconv.AppendInt(b, l.RemainingMS, 10)
	b = append(b, `,"expires_at":`...)
	if b, ok = appendJSONTime(b, l.ExpiresAt); !ok {
		return b, false
	}
	b = append(b, `,"acquired_at":`...)
	if b, ok = appendJSONTime(b, l.AcquiredAt); !ok {
		return b, false
	}
	if l.LastRenewedAt != nil {
		b = append(b, `,"last_renewed_at":`...)
		if b, ok = appendJSONTime(b, *l.LastRenewedAt); !ok {
			return b, false
		}
	}
	if l.EndedAt != nil {
		b = append(b, `,"ended_at":`...)
		if b, ok = appendJSONTime(b, *l.EndedAt); !ok {
			return b, false
		}
	}
	b = append(b, `,"heartbeat_interval_ms":`...)
	b = strconv.AppendInt(b, l.HeartbeatIntervalMS, 10)
	b = append(b, `,"renewal_count":`...)
	b = strconv.AppendUint(b, uint64(l.RenewalCount), 10)
	if len(l.Metadata) > 0 {
		m, err := json.Marshal(l.Metadata) // sorted keys, as a field of the lease
		if err != nil {
			return b, false
		}
		b = append(b, `,"metadata":`...)
		b = append(b, m...)
	}
	if l.EndReason != "" {
		b = append(b, `,"end_reason":`...)
		b = appendJSONString(b, l.EndReason)
	}
	if l.Token != "" {
		b = append(b, `,"token":`...)
		b = appendJSONString(b, l.Token)
	}
	if l.Grant != "" {
		b = append(b, `,"grant":`...)
		b = appendJSONString(b, l.Grant)
	}
	return append(b, '}'), true
}

// appendJSONString appends s as a JSON string, as encoding/json writes it:
// printable ASCII other than the characters it escapes goes as is; a string
// with anything else is encoded by encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON writes it (RFC 3339
// with nanoseconds); false for a time it refuses (a year outside 0-9999, a
// zone offset of 24 hours or more), which appendLeaseJSON leaves to
// encoding/json.
func appendJSONTime(b []byte, t time.Time) ([]byte, bool) {
	if y := t.Year(); y < 0 || y > 9999 {
		return b, false
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		return b, false
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), true
}
