package api

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/julienschmidt/httprouter"
)

// routeCounters counts the answers of one route by status code.
type routeCounters struct {
	method, path string
	codes        [600]atomic.Uint64
}

func (c *routeCounters) count(status int) {
	if status < 100 || status >= len(c.codes) {
		status = 0
	}
	c.codes[status].Add(1)
}

// httpMetrics holds the request counters: one per route (in the order of
// routes()) and one for requests no route matched. The slices are fixed at
// construction.
type httpMetrics struct {
	routes    []*routeCounters
	unmatched *routeCounters
	all       []*routeCounters // routes, then unmatched
}

func newHTTPMetrics(rs []route) *httpMetrics {
	m := &httpMetrics{all: make([]*routeCounters, 0, len(rs)+1)}
	for _, rt := range rs {
		m.all = append(m.all, &routeCounters{method: rt.method, path: rt.path})
	}
	m.routes = m.all[:len(rs):len(rs)]
	m.unmatched = &routeCounters{method: "other", path: "unmatched"}
	m.all = append(m.all, m.unmatched)
	return m
}

// metricsText handles GET /metrics: the node's counters and the HTTP request
// counts in the Prometheus text exposition format (version 0.0.4).
func (s *server) metricsText(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) error {
	st := s.n.Stats()
	var p promWriter

	p.gauge("leasehold_active_leases", "Leases currently active.", uint64(st.ActiveLeases))
	p.gauge("leasehold_active_sessions", "Sessions currently active.", uint64(st.ActiveSessions))
	p.counter("leasehold_leases_acquired_total", "Leases granted.", st.Acquired)
	p.counter("leasehold_leases_renewed_total", "Lease renewals, single and bulk.", st.Renewed)
	p.counter("leasehold_leases_released_total", "Leases released by their holder.", st.Released)
	p.counter("leasehold_leases_expired_total", "Leases that expired.", st.Expired)
	p.counter("leasehold_leases_revoked_total", "Leases revoked by an operator.", st.Revoked)
	p.counter("leasehold_sessions_created_total", "Sessions created.", st.SessionsCreated)
	p.counter("leasehold_session_heartbeats_total", "Session heartbeats.", st.SessionHeartbeats)
	p.counter("leasehold_session_heartbeats_late_total", "Session heartbeats that came too late: the session had already expired or ended (answered SESSION_ENDED).", st.LateHeartbeats)
	p.counter("leasehold_sessions_expired_total", "Sessions that expired.", st.SessionsExpired)

	p.header("leasehold_apply_latency_seconds", "Latency from proposal to apply of a write.", "histogram")
	for i, le := range st.ApplyBuckets {
		if i >= len(st.ApplyCounts) {
			break
		}
		p.sample("leasehold_apply_latency_seconds_bucket", `le="`+formatFloat(le)+`"`, strconv.FormatUint(st.ApplyCounts[i], 10))
	}
	p.sample("leasehold_apply_latency_seconds_bucket", `le="+Inf"`, strconv.FormatUint(st.ApplyCount, 10))
	p.sample("leasehold_apply_latency_seconds_sum", "", formatFloat(st.ApplySum))
	p.sample("leasehold_apply_latency_seconds_count", "", strconv.FormatUint(st.ApplyCount, 10))

	p.gauge("leasehold_commit_index", "Raft commit index known to this node.", st.CommitIndex)
	p.gauge("leasehold_applied_index", "Raft index this node has applied.", st.AppliedIndex)
	p.gauge("leasehold_tick", "Current cluster tick (committed ticks since the cluster began).", st.Tick)
	var isLeader uint64
	if st.IsLeader {
		isLeader = 1
	}
	p.gauge("leasehold_is_leader", "1 if this node is the Raft leader, else 0.", isLeader)
	p.gauge("leasehold_event_streams", "Open event subscriptions.", uint64(st.EventStreams))

	p.header("leasehold_http_requests_total", "HTTP requests answered, by method, route and status code.", "counter")
	for _, rc := range s.metrics.all {
		for code := range rc.codes {
			if n := rc.codes[code].Load(); n > 0 {
				labels := `method="` + escapeLabel(rc.method) + `",route="` + escapeLabel(rc.path) + `",code="` + strconv.Itoa(code) + `"`
				p.sample("leasehold_http_requests_total", labels, strconv.FormatUint(n, 10))
			}
		}
	}

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(p.buf.Bytes())
	return nil
}

// promWriter writes the Prometheus text format.
type promWriter struct {
	buf bytes.Buffer
}

func (p *promWriter) header(name, help, typ string) {
	p.buf.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " " + typ + "\n")
}

func (p *promWriter) sample(name, labels, value string) {
	p.buf.WriteString(name)
	if labels != "" {
		p.buf.WriteString("{" + labels + "}")
	}
	p.buf.WriteString(" " + value + "\n")
}

func (p *promWriter) gauge(name, help string, v uint64) {
	p.header(name, help, "gauge")
	p.sample(name, "", strconv.FormatUint(v, 10))
}

func (p *promWriter) counter(name, help string, v uint64) {
	p.header(name, help, "counter")
	p.sample(name, "", strconv.FormatUint(v, 10))
}

func formatFloat(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
}

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func escapeLabel(v string) string { return labelEscaper.Replace(v) }
