package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// The handler benchmarks drive the API's handler in process (no
// connection, no disk: an in-memory node) from 64 goroutines, to measure
// what a request costs in our own code: the handler, the batcher, the state
// machine and Raft's in-memory path. They report allocations and the
// process's CPU time per operation (cpu-µs/op).

// benchAPI opens an in-memory single node and its API handler.
func benchAPI(b *testing.B) http.Handler {
	b.Helper()
	uncheckedExchanges(b) // the schema check would cost more than the requests
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.MaxLeasesPerHolder = -1 // no limit: one holder holds every benchmark lease
	n, err := node.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	h := New(FromNode(n), Options{})
	for deadline := time.Now().Add(10 * time.Second); ; {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
		if rec.Code == 200 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the node did not become ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return h
}

// benchWriter is a response writer that keeps the status and the body of
// one answer, reused from request to request.
type benchWriter struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *benchWriter) Header() http.Header { return w.h }
func (w *benchWriter) WriteHeader(s int)   { w.status = s }
func (w *benchWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	return w.body.Write(p)
}

// SetWriteDeadline lets http.ResponseController set a deadline (none is
// kept), as a connection's writer does.
func (w *benchWriter) SetWriteDeadline(time.Time) error { return nil }

func (w *benchWriter) reset() {
	clear(w.h)
	w.status = 0
	w.body.Reset()
}

// serve sends one request through h.
func (w *benchWriter) serve(h http.Handler, method, target, body string, hdr ...string) {
	w.reset()
	req, _ := http.NewRequest(method, "http://leasehold"+target, strings.NewReader(body))
	req.RemoteAddr = "127.0.0.1:1"
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	h.ServeHTTP(w, req)
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runBench runs op from 64 goroutines and reports cpu-µs/op.
func runBench(b *testing.B, op func(w *benchWriter, g int64, i int)) {
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	cpu0 := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		g := seq.Add(1)
		w := &benchWriter{h: http.Header{}}
		for i := 0; pb.Next(); i++ {
			op(w, g, i)
		}
	})
	b.ReportMetric(float64((cpuNow()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkHandlerCycle is an acquire and a release of a lease on a key of
// its own, as `leasehold bench --workload cycle` sends them.
func BenchmarkHandlerCycle(b *testing.B) {
	h := benchAPI(b)
	runBench(b, func(w *benchWriter, g int64, i int) {
		w.serve(h, "POST", "/v1/leases", fmt.Sprintf(`{"key":"b/%d/%d","holder":"bench-%d","ttl_ms":30000}`, g, i, g))
		if w.status != 201 {
			b.Fatalf("acquire: %d %s", w.status, w.body.String())
		}
		var l wire.Lease
		if err := json.Unmarshal(w.body.Bytes(), &l); err != nil {
			b.Fatal(err)
		}
		w.serve(h, "DELETE", "/v1/leases/"+l.LeaseID, "", "X-Lease-Token", l.Token)
		if w.status != 200 {
			b.Fatalf("release: %d %s", w.status, w.body.String())
		}
	})
}

// BenchmarkHandlerRenew is a renewal of a lease each goroutine holds.
func BenchmarkHandlerRenew(b *testing.B) {
	h := benchAPI(b)
	leases := make([]wire.Lease, 129)
	for i := range leases {
		w := &benchWriter{h: http.Header{}}
		w.serve(h, "POST", "/v1/leases", fmt.Sprintf(`{"key":"r/%d","holder":"bench","ttl_ms":600000}`, i))
		if w.status != 201 {
			b.Fatalf("acquire: %d %s", w.status, w.body.String())
		}
		if err := json.Unmarshal(w.body.Bytes(), &leases[i]); err != nil {
			b.Fatal(err)
		}
	}
	runBench(b, func(w *benchWriter, g int64, i int) {
		l := leases[g%int64(len(leases))]
		w.serve(h, "POST", "/v1/leases/"+l.LeaseID+"/renew", "", "X-Lease-Token", l.Token)
		if w.status != 200 {
			b.Fatalf("renew: %d %s", w.status, w.body.String())
		}
	})
}

// BenchmarkKeepAliveStream is renewals over keep-alive streams, as
// `leasehold bench --workload keepalive` sends them: 64 goroutines, eight
// to a stream, each renewing a lease of its own, through the Go client
// and a loopback HTTP server (so cpu-µs/op is the client's and the
// server's together).
func BenchmarkKeepAliveStream(b *testing.B) {
	h := benchAPI(b)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	c, err := client.New([]string{srv.URL}, client.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	const goroutines, perStream = 64, 8
	leases := make([]*wire.Lease, goroutines)
	streams := make([]*client.RenewStream, goroutines/perStream)
	for i := range leases {
		if leases[i], err = c.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("ka/%d", i), Holder: "bench", TTLMS: 600000}); err != nil {
			b.Fatal(err)
		}
	}
	for i := range streams {
		if streams[i], err = c.KeepAliveStream(ctx); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { streams[i].Close() })
	}
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(goroutines / 2) // GOMAXPROCS is 2 here
	b.ResetTimer()
	cpu0 := cpuNow()
	b.RunParallel(func(pb *testing.PB) {
		g := int(seq.Add(1)-1) % goroutines
		l, rs := leases[g], streams[g/perStream]
		for pb.Next() {
			if a, err := rs.Renew(ctx, l.LeaseID, l.Token, 0); err != nil || !a.OK {
				b.Fatalf("renew: %+v %v", a, err)
			}
		}
	})
	b.ReportMetric(float64((cpuNow()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// instantNode answers a renewal at once with one fixed lease, so that the
// benchmarks below measure the API's request path without the batcher,
// Raft or the state machine.
type instantNode struct {
	*fakeNode
	lease *wire.Lease
}

func (n instantNode) Renew(context.Context, wire.RenewRequest) (*wire.Lease, error) {
	return n.lease, nil
}

// BenchmarkHandlerRenewOnly is a renewal through the handler, from one
// goroutine, with a node that answers at once: what a renewal costs in the
// API's own code (routing, request id, answer, headers, metrics).
func BenchmarkHandlerRenewOnly(b *testing.B) {
	uncheckedExchanges(b)
	h := New(instantNode{fakeNode: newFake(), lease: testLease("ls_1")}, Options{})
	w := &benchWriter{h: http.Header{}}
	req, _ := http.NewRequest("POST", "http://leasehold/v1/leases/ls_1/renew", http.NoBody)
	req.RemoteAddr = "127.0.0.1:1"
	req.Header.Set(headerLeaseToken, "secret")
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuNow()
	for i := 0; i < b.N; i++ {
		w.reset()
		h.ServeHTTP(w, req)
		if w.status != 200 {
			b.Fatalf("renew: %d %s", w.status, w.body.String())
		}
	}
	b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkLoopbackRenew sends renewals over 16 keep-alive loopback
// connections to a net/http server, with a node that answers at once:
// "api" is the API's handler, "bare" a handler writing the same answer
// with Content-Type alone. cpu-ns/op is the process's (client, server and
// the kernel's work for both); api minus bare is what the API adds to
// net/http per request.
func BenchmarkLoopbackRenew(b *testing.B) {
	answer, _ := appendLeaseJSON(nil, testLease("ls_1"))
	answer = append(answer, '\n')
	for _, c := range []struct {
		name string
		h    func(b *testing.B) http.Handler
	}{
		{"api", func(b *testing.B) http.Handler {
			uncheckedExchanges(b)
			return New(instantNode{fakeNode: newFake(), lease: testLease("ls_1")}, Options{})
		}},
		{"bare", func(*testing.B) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header()["Content-Type"] = headerJSON
				_, _ = w.Write(answer)
			})
		}},
	} {
		b.Run(c.name, func(b *testing.B) { loopbackRenew(b, c.h(b)) })
	}
}

func loopbackRenew(b *testing.B, h http.Handler) {
	srv := httptest.NewServer(h)
	defer srv.Close()
	const conns = 16
	req := "POST /v1/leases/ls_1/renew HTTP/1.1\r\nHost: leasehold\r\nX-Lease-Token: secret\r\nContent-Length: 0\r\n\r\n"
	per := (b.N + conns - 1) / conns
	errs := make(chan error, conns)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuNow()
	for range conns {
		go func() {
			errs <- func() error {
				conn, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					return err
				}
				defer conn.Close()
				br := bufio.NewReader(conn)
				for range per {
					if _, err := io.WriteString(conn, req); err != nil {
						return err
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						return err
					}
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil {
						return err
					}
					if resp.StatusCode != 200 {
						return fmt.Errorf("renew: status %d", resp.StatusCode)
					}
				}
				return nil
			}()
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(per*conns), "cpu-ns/op")
}
