package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestPrinters pins the readable output of leases, sessions, groups and
// their lists, and of an answer without a body.
func TestPrinters(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	ended := at.Add(time.Minute)
	// timeString prints local time: the wanted output says it as the test's.
	tAt, tEnd := at.Local().Format(time.RFC3339), ended.Local().Format(time.RFC3339)
	active := &wire.Lease{LeaseID: "ls_1", Key: "jobs/1", Holder: "me", State: "active", FencingToken: 42, Limit: 2,
		SessionID: "ss_1", GroupID: "lg_1", TTLMS: 5000, RemainingMS: 4200, ExpiresAt: at, HeartbeatIntervalMS: 1666,
		AcquiredAt: at, LastRenewedAt: &at, RenewalCount: 3, Metadata: map[string]string{"b": "2", "a": "1"},
		Token: "tok", Grant: "jws"}
	gone := &wire.Lease{LeaseID: "ls_2", Key: "jobs/2", Holder: "you", State: "revoked", FencingToken: 7, Limit: 1,
		TTLMS: 90000, RemainingMS: 100, AcquiredAt: at, EndedAt: &ended, EndReason: "operator"}
	session := &wire.Session{SessionID: "ss_1", Holder: "me", State: "active", TTLMS: 30000, RemainingMS: 29500,
		ExpiresAt: at, HeartbeatIntervalMS: 10000, CreatedAt: at, LastHeartbeat: &at, HeartbeatCount: 5,
		Metadata: map[string]string{"x": "y"}, LeaseIDs: []string{"ls_1", "ls_3"}, Token: "stok"}
	endedSession := &wire.Session{SessionID: "ss_2", Holder: "you", State: "ended", TTLMS: 30000, CreatedAt: at,
		EndedAt: &ended, EndReason: "session_ended"}
	group := &wire.LeaseGroup{GroupID: "lg_1", Holder: "me", State: "active", TTLMS: 5000, RemainingMS: 4200,
		ExpiresAt: at, HeartbeatIntervalMS: 1666, Token: "gtok", Leases: []*wire.Lease{
			{Key: "a", LeaseID: "ls_1", FencingToken: 42, Limit: 1, State: "active"},
			{Key: "bb", LeaseID: "ls_3", FencingToken: 43, Limit: 2, State: "active"}}}
	for _, tt := range []struct {
		name  string
		print func(io.Writer) error
		want  string
	}{
		{"active lease", func(w io.Writer) error { return printLease(w, active) }, "lease_id            ls_1\nkey                 jobs/1\nholder              me\nstate               active\nfencing_token       42\nlimit               2\nsession_id          ss_1\ngroup_id            lg_1\nttl                 5s\nremaining           4.2s\nexpires_at          $AT\nheartbeat_interval  1.67s\nacquired_at         $AT\nlast_renewed_at     $AT\nrenewals            3\nmetadata            a=1,b=2\ntoken               tok\ngrant               jws\n"},
		{"ended lease", func(w io.Writer) error { return printLease(w, gone) }, "lease_id       ls_2\nkey            jobs/2\nholder         you\nstate          revoked\nfencing_token  7\nttl            1m30s\nacquired_at    $AT\nrenewals       0\nended_at       $END\nend_reason     operator\n"},
		{"active session", func(w io.Writer) error { return printSession(w, session) }, "session_id          ss_1\nholder              me\nstate               active\nttl                 30s\nremaining           29.5s\nexpires_at          $AT\nheartbeat_interval  10s\ncreated_at          $AT\nlast_heartbeat      $AT\nheartbeats          5\nmetadata            x=y\nleases              ls_1 ls_3\ntoken               stok\n"},
		{"ended session", func(w io.Writer) error { return printSession(w, endedSession) }, "session_id  ss_2\nholder      you\nstate       ended\nttl         30s\ncreated_at  $AT\nheartbeats  0\nended_at    $END\nend_reason  session_ended\n"},
		{"group", func(w io.Writer) error { return printGroup(w, group) }, "group_id            lg_1\nholder              me\nstate               active\nttl                 5s\nremaining           4.2s\nexpires_at          $AT\nheartbeat_interval  1.67s\ntoken               gtok\n\nKEY  LEASE_ID  FENCING_TOKEN  LIMIT  STATE\na    ls_1      42             1      active\nbb   ls_3      43             2      active\n"},
		{"lease list", func(w io.Writer) error {
			return printLeaseList(w, &wire.LeaseList{Leases: []*wire.Lease{active, gone}, Next: "cur"})
		}, "LEASE_ID  KEY     HOLDER  STATE    FENCING  REMAINING  SESSION\nls_1      jobs/1  me      active   42       4.2s       ss_1\nls_2      jobs/2  you     revoked  7        -          -\nmore: --after cur (or --all)\n"},
		{"last lease page", func(w io.Writer) error { return printLeaseList(w, &wire.LeaseList{Leases: []*wire.Lease{gone}}) }, "LEASE_ID  KEY     HOLDER  STATE    FENCING  REMAINING  SESSION\nls_2      jobs/2  you     revoked  7        -          -\n"},
		{"session list", func(w io.Writer) error {
			return printSessionList(w, &wire.SessionList{Sessions: []*wire.Session{session, endedSession}, Next: "cur"})
		}, "SESSION_ID  HOLDER  STATE   REMAINING  LEASES\nss_1        me      active  29.5s      2\nss_2        you     ended   -          0\nmore: --after cur (or --all)\n"},
	} {
		var b bytes.Buffer
		if err := tt.print(&b); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		want := strings.NewReplacer("$AT", tAt, "$END", tEnd).Replace(tt.want)
		if b.String() != want {
			t.Errorf("%s:\n%q\nwant\n%q", tt.name, b.String(), want)
		}
	}
}

// TestPrintOr: an answer without a body prints the fallback line, or {}
// with --json; one with a body prints as output does.
func TestPrintOr(t *testing.T) {
	for _, tt := range []struct {
		l      *wire.Lease
		asJSON bool
		want   string
	}{
		{nil, false, "released ls_1\n"},
		{nil, true, "{}\n"},
		{&wire.Lease{LeaseID: "ls_1"}, false, "lease_id       ls_1\nfencing_token  0\nttl            0s\nrenewals       0\n"},
	} {
		var b bytes.Buffer
		if err := printOr(&b, tt.asJSON, tt.l, "released ls_1", printLease); err != nil {
			t.Fatal(err)
		}
		if b.String() != tt.want {
			t.Errorf("printOr(%v, json %v) = %q, want %q", tt.l, tt.asJSON, b.String(), tt.want)
		}
	}
}
