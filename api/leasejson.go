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
	if !wire.PlainJSONString(s) {
		q, _ := json.Marshal(s) // a string always encodes
		return append(b, q...)
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

// appendKeepAliveJSON appends a keep-alive answer as encoding/json encodes
// it (the same bytes), without reflection, when it carries no error: a
// renewal's answer on a keep-alive stream. ok is false (nothing appended
// that counts) for an answer with an error or a time encoding/json would
// refuse: the caller then encodes with encoding/json.
func appendKeepAliveJSON(b []byte, a *wire.KeepAliveAnswer) (_ []byte, ok bool) {
	if a.Error != nil {
		return b, false
	}
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, a.ID, 10)
	if a.LeaseID != "" {
		b = append(b, `,"lease_id":`...)
		b = appendJSONString(b, a.LeaseID)
	}
	b = append(b, `,"ok":`...)
	b = strconv.AppendBool(b, a.OK)
	if a.FencingToken != 0 {
		b = append(b, `,"fencing_token":`...)
		b = strconv.AppendUint(b, a.FencingToken, 10)
	}
	if a.TTLMS != 0 {
		b = append(b, `,"ttl_ms":`...)
		b = strconv.AppendInt(b, a.TTLMS, 10)
	}
	if a.RemainingMS != 0 {
		b = append(b, `,"remaining_ms":`...)
		b = strconv.AppendInt(b, a.RemainingMS, 10)
	}
	if a.ExpiresAt != nil {
		b = append(b, `,"expires_at":`...)
		if b, ok = appendJSONTime(b, *a.ExpiresAt); !ok {
			return b, false
		}
	}
	if a.RenewalCount != 0 {
		b = append(b, `,"renewal_count":`...)
		b = strconv.AppendUint(b, uint64(a.RenewalCount), 10)
	}
	if a.Status != 0 {
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(a.Status), 10)
	}
	return append(b, '}'), true
}

// parseKeepAliveLine reads a keep-alive line of the form the Go client
// writes ({"id":1,"lease_id":"…","token":"…"} with an optional "ttl_ms",
// no white space, strings of printable ASCII without escapes, plain
// integers) into req, without reflection. ok is false for anything else
// (other fields, escapes, white space, a repeated field, a number
// encoding/json would read otherwise or refuse): the caller then decodes
// the line with encoding/json, so the two read every line alike.
func parseKeepAliveLine(line []byte, req *wire.KeepAliveRenewal) (ok bool) {
	var r wire.KeepAliveRenewal
	var seen [4]bool
	if !wire.ScanFlatLine(line, func(key []byte, v *wire.FlatValue) bool {
		var f int
		var ok bool
		switch string(key) {
		case "id":
			f = 0
			r.ID, ok = v.Uint()
		case "lease_id":
			f = 1
			r.LeaseID, ok = v.String()
		case "token":
			f = 2
			r.Token, ok = v.String()
		case "ttl_ms":
			f = 3
			var n uint64
			n, ok = v.Uint()
			r.TTLMS = int64(n)
		}
		if !ok || seen[f] {
			return false
		}
		seen[f] = true
		return true
	}) {
		return false
	}
	*req = r
	return true
}
