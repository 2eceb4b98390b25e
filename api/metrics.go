package api

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/leasehold/leasehold/node"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routeLabels name a route in the metrics: its method and httprouter
// pattern (never the raw path, whose ids would make a series per lease).
type routeLabels struct {
	method, path string
}

// unmatched labels the requests no route matched (404, 405).
var unmatched = &routeLabels{method: "other", path: "unmatched"}

// httpMetrics are the API's own metrics, in a registry of the server's
// own (several servers may run in one process). /metrics serves it
// together with the node's registry (node.Node.Registry) when the node has
// one.
type httpMetrics struct {
	reg       *prometheus.Registry
	routes    []*routeLabels // in the order of the routes given
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	forwarded *prometheus.CounterVec
	handler   http.Handler
	// observers caches the request counter and duration histogram of each
	// route and status seen (obsKey -> *routeObservers): looked up by
	// label values once, not on every request.
	observers sync.Map
}

type obsKey struct {
	rl     *routeLabels
	status int
}

type routeObservers struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

func newHTTPMetrics(n Node, rs []route) *httpMetrics {
	m := &httpMetrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_http_requests_total",
			Help: "HTTP requests answered, by method, route and status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasehold_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by method, route (pattern) and status code. Event streams, waits and snapshot transfers last long by design.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method", "route", "code"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_forwarded_requests_total",
			Help: "Requests this follower forwarded to the leader, by outcome: proxied (the leader answered), failed (answered with an error here), local (leadership moved here; answered locally).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{"proxied", "failed", "local"} {
		m.forwarded.WithLabelValues(o)
	}
	for _, rt := range rs {
		m.routes = append(m.routes, &routeLabels{method: rt.method, path: rt.path})
	}
	m.reg.MustRegister(m.requests, m.duration, m.forwarded, statsCollector{n})
	gather := prometheus.Gatherers{m.reg}
	if nr := n.Registry(); nr != nil {
		gather = append(gather, nr)
	}
	m.handler = promhttp.HandlerFor(gather, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return m
}

// observe records one answered request.
func (m *httpMetrics) observe(rl *routeLabels, status int, d time.Duration) {
	k := obsKey{rl, status}
	o, ok := m.observers.Load(k)
	if !ok {
		code := strconv.Itoa(status)
		o, _ = m.observers.LoadOrStore(k, &routeObservers{
			requests: m.requests.WithLabelValues(rl.method, rl.path, code),
			duration: m.duration.WithLabelValues(rl.method, rl.path, code),
		})
	}
	ro := o.(*routeObservers)
	ro.requests.Inc()
	ro.duration.Observe(d.Seconds())
}

// metricsText handles GET /metrics: the Prometheus exposition of this
// server's registries.
func (s *infoAPI) metricsText(w http.ResponseWriter, r *http.Request, _ httprouter.Params) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}

var (
	descActiveLeases   = prometheus.NewDesc("leasehold_active_leases", "Leases currently active.", nil, nil)
	descActiveSessions = prometheus.NewDesc("leasehold_active_sessions", "Sessions currently active.", nil, nil)
	descCommitIndex    = prometheus.NewDesc("leasehold_commit_index", "Raft commit index known to this node.", nil, nil)
	descAppliedIndex   = prometheus.NewDesc("leasehold_applied_index", "Raft index this node has applied.", nil, nil)
	descTick           = prometheus.NewDesc("leasehold_tick", "Current cluster tick (committed ticks since the cluster began), as this node applied it.", nil, nil)
	descIsLeader       = prometheus.NewDesc("leasehold_is_leader", "1 if this node is the Raft leader, else 0.", nil, nil)
	descEventStreams   = prometheus.NewDesc("leasehold_event_streams", "Open event-stream subscriptions (GET /v1/events) on this node.", nil, nil)
	descApplyLatency   = prometheus.NewDesc("leasehold_apply_latency_seconds", "Latency from proposal to apply of a write proposed on this node (the leader).", nil, nil)
	descLateHeartbeats = prometheus.NewDesc("leasehold_session_heartbeats_late_total", "Session heartbeats this node answered SESSION_ENDED: the session had already expired or ended.", nil, nil)

	// eventCounters are the counters of replicated events: every server
	// counts each event of an entry applied after its startup's replay.
	eventCounters = []struct {
		desc *prometheus.Desc
		get  func(*node.Stats) uint64
	}{
		{evDesc("leasehold_leases_acquired_total", "Leases granted."), func(s *node.Stats) uint64 { return s.Acquired }},
		{evDesc("leasehold_leases_renewed_total", "Lease renewals, single and bulk."), func(s *node.Stats) uint64 { return s.Renewed }},
		{evDesc("leasehold_leases_released_total", "Leases released by their holder."), func(s *node.Stats) uint64 { return s.Released }},
		{evDesc("leasehold_leases_expired_total", "Leases that expired."), func(s *node.Stats) uint64 { return s.Expired }},
		{evDesc("leasehold_leases_revoked_total", "Leases revoked by an operator."), func(s *node.Stats) uint64 { return s.Revoked }},
		{evDesc("leasehold_sessions_created_total", "Sessions created."), func(s *node.Stats) uint64 { return s.SessionsCreated }},
		{evDesc("leasehold_session_heartbeats_total", "Session heartbeats."), func(s *node.Stats) uint64 { return s.SessionHeartbeats }},
		{evDesc("leasehold_sessions_expired_total", "Sessions that expired."), func(s *node.Stats) uint64 { return s.SessionsExpired }},
	}
)

func evDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help+" Counted by every server for the entries it applied after starting (not again on the startup's replay): aggregate over servers with max, not sum.", nil, nil)
}

// statsCollector exposes the node's Stats, read at each scrape.
type statsCollector struct{ n Node }

func (c statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descActiveLeases, descActiveSessions, descCommitIndex, descAppliedIndex,
		descTick, descIsLeader, descEventStreams, descApplyLatency, descLateHeartbeats} {
		ch <- d
	}
	for _, e := range eventCounters {
		ch <- e.desc
	}
}

func (c statsCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.n.Stats()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(descActiveLeases, float64(st.ActiveLeases))
	gauge(descActiveSessions, float64(st.ActiveSessions))
	gauge(descCommitIndex, float64(st.CommitIndex))
	gauge(descAppliedIndex, float64(st.AppliedIndex))
	gauge(descTick, float64(st.Tick))
	leader := 0.0
	if st.IsLeader {
		leader = 1
	}
	gauge(descIsLeader, leader)
	gauge(descEventStreams, float64(st.EventStreams))
	for _, e := range eventCounters {
		ch <- prometheus.MustNewConstMetric(e.desc, prometheus.CounterValue, float64(e.get(&st)))
	}
	ch <- prometheus.MustNewConstMetric(descLateHeartbeats, prometheus.CounterValue, float64(st.LateHeartbeats))
	buckets := make(map[float64]uint64, len(st.ApplyBuckets))
	for i, le := range st.ApplyBuckets {
		if i < len(st.ApplyCounts) {
			buckets[le] = st.ApplyCounts[i]
		}
	}
	ch <- prometheus.MustNewConstHistogram(descApplyLatency, st.ApplyCount, st.ApplySum, buckets)
}
