package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = ms(i + 1) // 1..100 ms
	}
	thousand := make([]time.Duration, 1000)
	for i := range thousand {
		thousand[i] = ms(i + 1)
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one sample", []time.Duration{ms(7)}, 99.9, ms(7)},
		{"median of 100", hundred, 50, ms(50)},
		{"p99 of 100", hundred, 99, ms(99)},
		{"p99.9 of 100 is the max", hundred, 99.9, ms(100)},
		{"p100", hundred, 100, ms(100)},
		{"tiny p is the min", hundred, 0.001, ms(1)},
		{"p99.9 of 1000", thousand, 99.9, ms(999)},
		{"p50 of two", []time.Duration{ms(1), ms(2)}, 50, ms(1)},
		{"p51 of two", []time.Duration{ms(1), ms(2)}, 51, ms(2)},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: percentile(p=%v) = %v, want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	if s := summarize(nil); s != (latencySummary{}) {
		t.Errorf("empty: %+v", s)
	}
	samples := []time.Duration{ms(4), ms(1), ms(3), ms(2)} // unsorted
	s := summarize(samples)
	want := latencySummary{Count: 4, Mean: 2.5, P50: 2, P99: 4, P999: 4, Max: 4}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
}

func TestHeartbeatChunksFitTheBodyLimit(t *testing.T) {
	items := make([]wire.HeartbeatItem, 2500)
	for i := range items {
		items[i] = wire.HeartbeatItem{LeaseID: fmt.Sprintf("ls_%016x", i), Token: strings.Repeat("t", 32)}
	}
	chunks := heartbeatChunks(items)
	total := 0
	for _, c := range chunks {
		body, _ := json.Marshal(map[string]any{"leases": c})
		if len(body) > maxBodyBytes {
			t.Errorf("chunk of %d items is %d bytes", len(c), len(body))
		}
		total += len(c)
	}
	if total != len(items) || len(chunks) < 3 {
		t.Errorf("%d chunks holding %d items", len(chunks), total)
	}
	if heartbeatChunks(nil) != nil {
		t.Error("chunks of nothing")
	}
}

// fakeEntries is how far the fake server's commit index moves between two
// reads of it.
const fakeEntries = 1000

// fakeBenchServer grants every acquire (one holder at a time per key for
// waits is not modelled), renews and heartbeats everything.
func fakeBenchServer(t *testing.T) (*client.Client, *atomic.Int64) {
	var n, active, reads atomic.Int64
	var mu sync.Mutex
	bound := map[string]int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/keepalive" {
			keepAliveFake(w, r)
			return
		}
		data, _ := io.ReadAll(r.Body)
		if strings.HasPrefix(r.UserAgent(), "Go-http-client/") && !strings.HasPrefix(r.URL.Path, "/v1/keys") {
			goClientRequests.Add(1)
		} else {
			rawRequests.Add(1)
		}
		switch {
		case r.Method == "POST" && r.URL.Path == "/v1/sessions":
			writeJSONTest(w, 201, wire.Session{SessionID: fmt.Sprintf("ss_%d", n.Add(1)), State: "active", Token: "stok"})
		case r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/v1/sessions/") && strings.HasSuffix(r.URL.Path, "/heartbeat"):
			writeJSONTest(w, 200, wire.Session{State: "active"})
		case r.Method == "DELETE" && strings.HasPrefix(r.URL.Path, "/v1/sessions/"):
			// Ending the session releases its bound leases.
			mu.Lock()
			active.Add(-bound[r.URL.Path[len("/v1/sessions/"):]])
			mu.Unlock()
			writeJSONTest(w, 200, wire.Session{State: "ended"})
		case r.Method == "POST" && r.URL.Path == "/v1/leases":
			id := n.Add(1)
			active.Add(1)
			var req wire.AcquireRequest
			_ = json.Unmarshal(data, &req)
			if req.SessionID != "" {
				mu.Lock()
				bound[req.SessionID]++
				mu.Unlock()
			}
			writeJSONTest(w, 201, wire.Lease{LeaseID: fmt.Sprintf("ls_%d", id), State: "active", Token: "tok"})
		case r.Method == "DELETE":
			active.Add(-1)
			writeJSONTest(w, 200, wire.Lease{State: "released"})
		case strings.HasSuffix(r.URL.Path, "/renew"):
			writeJSONTest(w, 200, wire.Lease{State: "active"})
		case r.Method == "GET" && r.URL.Path == "/v1/cluster":
			// The commit index moves by fakeEntries between reads: a
			// workload reads it before and after its measured phase.
			writeJSONTest(w, 200, wire.ClusterStatus{CommitIndex: fakeEntries * uint64(reads.Add(1))})
		case r.URL.Path == "/v1/heartbeat":
			var body struct{ Leases []wire.HeartbeatItem }
			mu.Lock()
			_ = json.Unmarshal(data, &body)
			mu.Unlock()
			res := make([]wire.HeartbeatResult, len(body.Leases))
			for i, it := range body.Leases {
				res[i] = wire.HeartbeatResult{LeaseID: it.LeaseID, OK: true}
			}
			writeJSONTest(w, 200, map[string]any{"results": res})
		default:
			w.WriteHeader(404)
		}
	}))
	t.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c, &active
}

// goClientRequests and rawRequests count the fake server's requests sent
// by Go's HTTP client (api/client) and by the load generator's own
// connections (no User-Agent).
var goClientRequests, rawRequests atomic.Int64

// TestBenchViaClient: --via client sends the per-request workloads through
// api/client (every request the fake server sees comes from Go's HTTP
// client), with the same results as the raw connections; --via raw sends
// them through the load generator's own connections.
func TestBenchViaClient(t *testing.T) {
	for _, w := range []string{"cycle", "contended", "renew", "session", fillWorkload} {
		for _, via := range []string{viaClient, viaRaw} {
			t.Run(w+"/"+via, func(t *testing.T) {
				c, active := fakeBenchServer(t)
				// Ended by maxOps, not the clock: a loaded machine finished no
				// operation in a 200 ms run.
				cfg := benchConfig{clients: 3, duration: time.Minute, batch: 5, ttl: 10 * time.Second,
					maxOps: 300, prefix: "b/", runID: "t", via: via}
				goBefore, rawBefore := goClientRequests.Load(), rawRequests.Load()
				r, err := runWorkload(context.Background(), c, w, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if r.Ops == 0 || r.Errors != 0 || r.Latency.Count == 0 {
					t.Errorf("result %+v", r)
				}
				goN, rawN := goClientRequests.Load()-goBefore, rawRequests.Load()-rawBefore
				switch {
				case via == viaClient && rawN != 0:
					t.Errorf("--via client: %d requests did not come from the Go client (%d did)", rawN, goN)
				case via == viaRaw && rawN < r.Requests:
					t.Errorf("--via raw: %d raw requests for %d measured", rawN, r.Requests)
				}
				if w != fillWorkload {
					if got := active.Load(); got != 0 {
						t.Errorf("%d leases left behind", got)
					}
				}
			})
		}
	}
}

func TestParseVia(t *testing.T) {
	for in, want := range map[string]string{"raw": "raw", "client": "client", "raw,client": "raw client", " client , raw": "client raw"} {
		got, err := parseVia(in)
		if err != nil || strings.Join(got, " ") != want {
			t.Errorf("parseVia(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "http", "raw,raw", "client,"} {
		if got, err := parseVia(in); err == nil {
			t.Errorf("parseVia(%q) = %v, want an error", in, got)
		}
	}
}

// keepAliveFake answers every renewal line of a keep-alive stream OK.
func keepAliveFake(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	w.WriteHeader(200)
	_ = rc.Flush()
	sc := bufio.NewScanner(r.Body)
	for sc.Scan() {
		var req wire.KeepAliveRenewal
		if json.Unmarshal(sc.Bytes(), &req) != nil {
			continue
		}
		b, _ := json.Marshal(wire.KeepAliveAnswer{ID: req.ID, LeaseID: req.LeaseID, OK: true})
		_, _ = w.Write(append(b, '\n'))
		_ = rc.Flush()
	}
}

func TestBenchWorkloads(t *testing.T) {
	for _, w := range benchWorkloads {
		t.Run(w, func(t *testing.T) {
			c, active := fakeBenchServer(t)
			// Ended by maxOps, not the clock: a loaded machine finished no
			// operation in a 200 ms run. (TestBenchDurationEnds: the clock.)
			cfg := benchConfig{clients: 4, duration: time.Minute, batch: 10, ttl: 10 * time.Second,
				maxOps: 300, prefix: "b/", runID: "t", perStream: 3}
			start := time.Now()
			r, err := runWorkload(context.Background(), c, w, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > cfg.duration {
				t.Errorf("took %v", took)
			}
			if r.Ops == 0 || r.Errors != 0 || r.OpsPerSec <= 0 || r.Latency.Count == 0 || r.Seconds > cfg.duration.Seconds() {
				t.Errorf("result %+v", r)
			}
			if r.Latency.P50 > r.Latency.P99 || r.Latency.P99 > r.Latency.P999 || r.Latency.P999 > r.Latency.Max {
				t.Errorf("percentiles out of order: %+v", r.Latency)
			}
			if want := float64(fakeEntries) / float64(r.Ops); r.EntriesPerOp != want {
				t.Errorf("entries per operation %v, want %v (%d entries over %d operations)", r.EntriesPerOp, want, fakeEntries, r.Ops)
			}
			if w == "heartbeat" && r.Ops < r.Requests*int64(cfg.batch) {
				t.Errorf("heartbeat: %d leases kept alive in %d requests of %d", r.Ops, r.Requests, cfg.batch)
			}
			if got := active.Load(); got != 0 {
				t.Errorf("%d leases left behind", got)
			}
		})
	}
}

// TestBenchDurationEnds: a run ends at its duration (maxOps far away) and
// reports no more than it.
func TestBenchDurationEnds(t *testing.T) {
	c, _ := fakeBenchServer(t)
	cfg := benchConfig{clients: 3, duration: 300 * time.Millisecond, batch: 1, ttl: 10 * time.Second, maxOps: 1_000_000_000, prefix: "b/", runID: "t"}
	start := time.Now()
	r, err := runWorkload(context.Background(), c, "renew", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("a 300 ms run took %v", took)
	}
	if r.Seconds > 0.3+1e-9 || r.Ops >= cfg.maxOps {
		t.Errorf("result %+v", r)
	}
}

func TestBenchMaxOps(t *testing.T) {
	c, _ := fakeBenchServer(t)
	cfg := benchConfig{clients: 3, duration: time.Hour, batch: 1, ttl: 10 * time.Second, maxOps: 50, prefix: "b/", runID: "t"}
	r, err := runWorkload(context.Background(), c, "renew", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 50 {
		t.Errorf("ops %d, want 50", r.Ops)
	}
}

func TestBenchRate(t *testing.T) {
	c, _ := fakeBenchServer(t)
	// 100 ops/s for 300ms: about 30 operations, certainly not thousands
	// (a loaded machine may finish fewer, none: the pacing is the upper
	// bound).
	cfg := benchConfig{clients: 2, duration: 300 * time.Millisecond, batch: 1, ttl: 10 * time.Second, maxOps: 1_000_000, rate: 100, prefix: "b/", runID: "t"}
	r, err := runWorkload(context.Background(), c, "renew", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops > 40 {
		t.Errorf("ops %d at 100/s for 300ms", r.Ops)
	}
}

// TestBenchFill: the fill workload acquires exactly --max-ops leases and
// leaves them all live.
func TestBenchFill(t *testing.T) {
	c, active := fakeBenchServer(t)
	cfg := benchConfig{clients: 4, duration: time.Hour, batch: 1, ttl: time.Minute, maxOps: 200, prefix: "b/", runID: "t"}
	r, err := runWorkload(context.Background(), c, fillWorkload, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 200 || r.Errors != 0 || r.Unit != "leases" {
		t.Errorf("result %+v", r)
	}
	if got := active.Load(); got != 200 {
		t.Errorf("%d leases live, want 200", got)
	}
}
