package api

import (
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/node"
)

var (
	metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$`)
	labelPair  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"$`)
)

// parseExposition checks the text format: HELP and TYPE precede each
// family's samples, every sample belongs to a declared family, values are
// numbers. It returns sample values by "name{labels}".
func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	types := map[string]string{}
	helps := map[string]bool{}
	samples := map[string]float64{}
	if !strings.HasSuffix(text, "\n") {
		t.Error("exposition does not end with a newline")
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		switch {
		case strings.HasPrefix(line, "# HELP "):
			f := strings.SplitN(line, " ", 4)
			if len(f) < 4 || f[3] == "" {
				t.Errorf("line %d: HELP without text: %q", i+1, line)
				continue
			}
			helps[f[2]] = true
		case strings.HasPrefix(line, "# TYPE "):
			f := strings.Fields(line)
			if len(f) != 4 {
				t.Errorf("line %d: malformed TYPE: %q", i+1, line)
				continue
			}
			if _, dup := types[f[2]]; dup {
				t.Errorf("line %d: second TYPE for %s", i+1, f[2])
			}
			switch f[3] {
			case "counter", "gauge", "histogram", "summary", "untyped":
			default:
				t.Errorf("line %d: unknown type %q", i+1, f[3])
			}
			types[f[2]] = f[3]
		case strings.HasPrefix(line, "#"):
			t.Errorf("line %d: unexpected comment %q", i+1, line)
		default:
			m := metricLine.FindStringSubmatch(line)
			if m == nil {
				t.Errorf("line %d: malformed sample %q", i+1, line)
				continue
			}
			name, labels, value := m[1], m[2], m[3]
			family := name
			if typ, ok := types[name]; !ok || typ == "histogram" || typ == "summary" {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if base, ok := strings.CutSuffix(name, suffix); ok && (types[base] == "histogram" || types[base] == "summary") {
						family = base
					}
				}
			}
			if _, ok := types[family]; !ok {
				t.Errorf("line %d: sample %s has no TYPE", i+1, name)
			}
			if !helps[family] {
				t.Errorf("line %d: sample %s has no HELP", i+1, name)
			}
			// Raft's and memberlist's own counters keep go-metrics' names
			// (leasehold_raft_state_leader, as Consul's raft metrics).
			if types[family] == "counter" && !strings.HasSuffix(name, "_total") && !goMetricsName(name) {
				t.Errorf("line %d: counter %s does not end in _total", i+1, name)
			}
			if labels != "" {
				for _, p := range splitLabels(strings.Trim(labels, "{}")) {
					if !labelPair.MatchString(p) {
						t.Errorf("line %d: malformed label %q", i+1, p)
					}
				}
			}
			v, err := strconv.ParseFloat(value, 64)
			if err != nil {
				t.Errorf("line %d: value %q: %v", i+1, value, err)
			}
			samples[name+labels] = v
		}
	}
	return samples
}

// goMetricsName reports whether a metric comes from hashicorp's
// go-metrics (raft, raft-boltdb, memberlist) through the Prometheus sink.
func goMetricsName(name string) bool {
	return strings.HasPrefix(name, "leasehold_raft_") || strings.HasPrefix(name, "leasehold_memberlist_")
}

// splitLabels splits a label list at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	quoted, escaped, start := false, false, 0
	for i, c := range s {
		switch {
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func TestMetrics(t *testing.T) {
	f := newFake()
	f.stats = node.Stats{
		ActiveLeases: 5, ActiveSessions: 2, Acquired: 10, Renewed: 20, Released: 3, Expired: 1, Revoked: 1,
		SessionsCreated: 4, SessionHeartbeats: 40, LateHeartbeats: 2, SessionsExpired: 1,
		CommitIndex: 1234567, AppliedIndex: 1234560, Tick: 99, IsLeader: true, EventStreams: 3,
		ApplyBuckets: []float64{0.0005, 0.001, 0.01, 0.1}, ApplyCounts: []uint64{1, 5, 9, 10},
		ApplySum: 0.125, ApplyCount: 11,
	}
	h := New(f, Options{})
	do(t, h, "GET", "/v1/leases/ls_1", "")
	do(t, h, "GET", "/v1/leases/ls_1", "")
	do(t, h, "POST", "/v1/leases", "{")
	do(t, h, "GET", "/nowhere", "")

	rec := do(t, h, "GET", "/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("status %d", rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type = %q", ct)
	}
	s := parseExposition(t, rec.Body.String())
	want := map[string]float64{
		"leasehold_active_leases":                                                       5,
		"leasehold_active_sessions":                                                     2,
		"leasehold_leases_acquired_total":                                               10,
		"leasehold_leases_renewed_total":                                                20,
		"leasehold_leases_released_total":                                               3,
		"leasehold_leases_expired_total":                                                1,
		"leasehold_leases_revoked_total":                                                1,
		"leasehold_sessions_created_total":                                              4,
		"leasehold_session_heartbeats_total":                                            40,
		"leasehold_session_heartbeats_late_total":                                       2,
		"leasehold_sessions_expired_total":                                              1,
		"leasehold_commit_index":                                                        1234567,
		"leasehold_applied_index":                                                       1234560,
		"leasehold_tick":                                                                99,
		"leasehold_is_leader":                                                           1,
		"leasehold_event_streams":                                                       3,
		`leasehold_apply_latency_seconds_bucket{le="0.0005"}`:                           1,
		`leasehold_apply_latency_seconds_bucket{le="0.1"}`:                              10,
		`leasehold_apply_latency_seconds_bucket{le="+Inf"}`:                             11,
		"leasehold_apply_latency_seconds_sum":                                           0.125,
		"leasehold_apply_latency_seconds_count":                                         11,
		`leasehold_http_requests_total{code="200",method="GET",route="/v1/leases/:id"}`: 2,
		`leasehold_http_requests_total{code="400",method="POST",route="/v1/leases"}`:    1,
		`leasehold_http_requests_total{code="404",method="other",route="unmatched"}`:    1,
		`leasehold_http_request_duration_seconds_count{code="200",method="GET",route="/v1/leases/:id"}`: 2,
		`leasehold_forwarded_requests_total{outcome="proxied"}`:                                         0,
	}
	for k, v := range want {
		if got, ok := s[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	// client_golang writes large values in exponent form (1.234567e+06),
	// which the format allows and Prometheus parses.
}

// TestMetricsEmptyStats: a node with no histogram still yields a valid
// exposition.
func TestMetricsEmptyStats(t *testing.T) {
	rec := do(t, New(newFake(), Options{}), "GET", "/metrics", "")
	s := parseExposition(t, rec.Body.String())
	if s[`leasehold_apply_latency_seconds_bucket{le="+Inf"}`] != 0 || s["leasehold_is_leader"] != 0 {
		t.Errorf("samples = %v", s)
	}
}

// TestMetricsCountEachStatusAndServer: a route's answers are counted under
// their own status however the statuses alternate, and two servers in one
// process count their own requests (the unmatched route's labels are
// shared by every server).
func TestMetricsCountEachStatusAndServer(t *testing.T) {
	h1, h2 := New(newFake(), Options{}), New(newFake(), Options{})
	acquire := `{"key":"k","holder":"h","ttl_ms":1000}`
	for _, body := range []string{acquire, "{", acquire, "{", "{"} {
		do(t, h1, "POST", "/v1/leases", body)
	}
	for _, h := range []http.Handler{h1, h2, h1, h1, h2, h1} {
		do(t, h, "GET", "/nowhere", "")
	}
	for h, want := range map[http.Handler]map[string]float64{
		h1: {
			`leasehold_http_requests_total{code="201",method="POST",route="/v1/leases"}`: 2,
			`leasehold_http_requests_total{code="400",method="POST",route="/v1/leases"}`: 3,
			`leasehold_http_requests_total{code="404",method="other",route="unmatched"}`: 4,
		},
		h2: {
			`leasehold_http_requests_total{code="404",method="other",route="unmatched"}`: 2,
		},
	} {
		s := parseExposition(t, do(t, h, "GET", "/metrics", "").Body.String())
		for k, v := range want {
			if got := s[k]; got != v {
				t.Errorf("%s = %v, want %v", k, got, v)
			}
		}
	}
}
