package node

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// nodeMetrics are the Prometheus metrics a node measures itself, in its
// own registry (Node.Registry): every node of a process has one, so that
// several in-process servers (tests) do not collide.
type nodeMetrics struct {
	reg            *prometheus.Registry
	tickInterval   prometheus.Histogram
	expiryLateness *prometheus.HistogramVec
	// latenessLease and latenessSession are expiryLateness's two series,
	// looked up once: a storm observes one per expired lease.
	latenessLease, latenessSession prometheus.Observer
	leaderChanges                  prometheus.Counter
	snapshotDuration               prometheus.Histogram
	snapshotSize                   prometheus.Gauge
	snapshots                      *prometheus.CounterVec
	acquireWait                    *prometheus.HistogramVec
}

// latencyBuckets (seconds) suit ticks, expiry lateness and waits: from a
// millisecond to a minute.
var latencyBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2.5, 5, 10, 30, 60}

// newNodeMetrics registers the node's metrics in reg (nil: a registry of
// its own); the gauges read cfg, the replica, the tick period, the
// consensus once it runs, and applyStall when scraped.
func newNodeMetrics(reg *prometheus.Registry, cfg *Config, rep *replica, period func() time.Duration, clP *atomic.Pointer[cluster.Cluster],
	applyStall func() string) *nodeMetrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &nodeMetrics{
		reg: reg,
		tickInterval: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_tick_interval_seconds",
			Help:    "Real time between two consecutive ticks this server committed as leader (the cluster clock's pace; ideally the tick period).",
			Buckets: latencyBuckets,
		}),
		expiryLateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasehold_expiry_lateness_seconds",
			Help:    "Real time from a lease's or session's nominal end (last renewal + TTL, wall clock) to its expiry being applied, measured by the leader; kind is lease or session.",
			Buckets: latencyBuckets,
		}, []string{"kind"}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_leader_changes_total",
			Help: "Times this server saw a new leader (another server, or itself) take over.",
		}),
		snapshotDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_snapshot_duration_seconds",
			Help:    "Time to encode and write a Raft snapshot of the state.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		snapshotSize: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_snapshot_size_bytes",
			Help: "Size of the last Raft snapshot written.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_snapshots_total",
			Help: "Raft snapshots this server wrote, by outcome (ok, failed).",
		}, []string{"outcome"}),
		acquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leasehold_acquire_wait_seconds",
			Help:    "Time a queued acquire (wait_ms > 0, key full) waited on this server, by outcome (granted, refused: timed out or failed).",
			Buckets: latencyBuckets,
		}, []string{"outcome"}),
	}
	for _, o := range []string{"ok", "failed"} {
		m.snapshots.WithLabelValues(o)
	}
	m.latenessLease = m.expiryLateness.WithLabelValues("lease")
	m.latenessSession = m.expiryLateness.WithLabelValues("session")
	for _, o := range []string{"granted", "refused"} {
		m.acquireWait.WithLabelValues(o)
	}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(cfg.version()),
		raftSink(),
		m.tickInterval, m.expiryLateness, m.leaderChanges, m.snapshotDuration, m.snapshotSize, m.snapshots, m.acquireWait,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_tick_period_seconds",
			Help: "The cluster's tick period.",
		}, func() float64 { return period().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_apply_stalled",
			Help: "1 while this server is a frozen follower: its applied index has not advanced for the apply stall timeout (--apply-stall-timeout, default 5s) while the cluster went on without it; /readyz then answers 503 with the reason. 0 otherwise.",
		}, func() float64 {
			if applyStall() != "" {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_fence_high",
			Help: "The highest fencing token the cluster has issued, as applied on this server: the fence floor for a restore of this cluster's backup into another cluster (--fence-floor).",
		}, func() float64 {
			rep.mu.RLock()
			defer rep.mu.RUnlock()
			return float64(rep.f.Fence())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_apply_idle_seconds",
			Help: "Seconds since this server's applied index last advanced (a healthy server applies a tick every tick period).",
		}, func() float64 { return rep.sinceMoved().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leasehold_term",
			Help: "This server's current Raft term.",
		}, func() float64 {
			if c := clP.Load(); c != nil {
				return float64(c.Term())
			}
			return 0
		}),
	)
	return m
}

// buildInfo is leasehold_build_info: always 1, with the version (Version,
// as gossiped), the VCS commit and the Go version as labels.
func buildInfo(version string) prometheus.Collector {
	commit := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				commit = s.Value
			}
		}
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "leasehold_build_info",
		Help:        "Always 1; labels say which build this server runs.",
		ConstLabels: prometheus.Labels{"version": version, "commit": commit, "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

var (
	raftSinkOnce sync.Once
	raftSinkC    prometheus.Collector
)

// raftSink returns the collector of hashicorp/raft's own metrics (commit
// time, FSM apply, last contact, replication, elections, the log store's
// append timing and raft-wal's metrics), named leasehold_raft_*. Raft reports them to go-metrics'
// process-wide global, so the first call installs, once per process, a
// go-metrics Prometheus sink as that global; every node's registry then
// collects the same sink (in-process test clusters share it; a deployed
// server is one per process). It uses go-metrics' compat packages, which
// pick armon/go-metrics or hashicorp/go-metrics by build tag exactly as the
// compiled raft does, so the sink is always the global raft writes to.
func raftSink() prometheus.Collector {
	raftSinkOnce.Do(func() {
		// Its own registerer: the sink is registered in every node's
		// registry, never in the global default one.
		sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{
			Expiration: 5 * time.Minute, Registerer: prometheus.NewRegistry(), Name: "leasehold_raft_sink",
		})
		if err != nil {
			panic("leasehold: go-metrics Prometheus sink: " + err.Error())
		}
		cfg := gometrics.DefaultConfig("leasehold")
		cfg.EnableHostname = false       // no host name in metric names
		cfg.EnableRuntimeMetrics = false // the Go collector has them
		cfg.EnableServiceLabel = false
		if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
			panic("leasehold: go-metrics global: " + err.Error())
		}
		raftSinkC = sink
	})
	return raftSinkC
}

// countLeaderChanges counts leader changes as Raft observes them, until
// closing is closed. The first leader this server knows counts, also when
// it is known before the count starts (a single server elects itself as
// soon as Raft starts).
func (m *nodeMetrics) countLeaderChanges(c *cluster.Cluster, closing <-chan struct{}) {
	var last atomic.Value // string
	if _, id := c.Leader(); id != "" {
		last.Store(id)
		m.leaderChanges.Inc()
	}
	stop := c.WatchLeader(func(id string) {
		if prev, _ := last.Load().(string); id != "" && id != prev {
			m.leaderChanges.Inc()
			last.Store(id)
		}
	})
	<-closing
	stop()
}

// observeExpiry records, on the leader, how late an expiry applied after
// its nominal end in real time.
func (m *nodeMetrics) observeExpiry(e *hubEvent, now time.Time) {
	switch {
	case e.Type == fsm.EventExpired && e.Lease != nil && e.Lease.SessionID == "":
		last := max(e.Lease.RenewedWallMS, e.Lease.AcquiredWallMS)
		lateness(m.latenessLease, last, e.Lease.TTLMS, now)
	case e.Type == fsm.EventSessionEnded && e.Session != nil && e.Session.State == fsm.SessionExpired:
		last := max(e.Session.LastHeartbeat, e.Session.CreatedWallMS)
		lateness(m.latenessSession, last, e.Session.TTLMS, now)
	}
}

// lateness observes in o how late, at now, an end due ttlMS after
// lastWallMS came.
func lateness(o prometheus.Observer, lastWallMS, ttlMS int64, now time.Time) {
	if lastWallMS <= 0 || ttlMS <= 0 {
		return
	}
	late := now.Sub(time.UnixMilli(lastWallMS + ttlMS)).Seconds()
	o.Observe(max(late, 0))
}

// countEvents counts the events of a batch in the lease and session
// counters (Stats) and, on the leader, observes expiry lateness. Counters
// mean one thing: events of entries applied after the startup's replay,
// counted once by every server that applies them (so the servers' counts
// agree; aggregate with max, not sum). Entries up to the log's last index
// at startup were counted by the run that first applied them.
func (r *replica) countEvents(evs []hubEvent) {
	from := r.replayEnd.Load()
	i := 0
	for i < len(evs) && evs[i].Index <= from {
		i++
	}
	evs = evs[i:]
	if len(evs) == 0 {
		return
	}
	r.stats.countEvents(evs)
	if r.metrics != nil && r.leading != nil && r.leading() {
		now := wallNow()
		for k := range evs {
			r.metrics.observeExpiry(&evs[k], now)
		}
	}
}
