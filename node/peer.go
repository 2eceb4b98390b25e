package node

import (
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/cluster"
)

// Node-to-node HTTP. Requests one server makes of another on behalf of the
// cluster (a follower's control lease operations, run by the leader) do not
// travel on the public HTTP listener, where any client could send them:
// they travel over the Raft port, on streams that pass the same checks as
// Raft's own connections (mutual TLS when Raft TLS is on, the cluster id
// exchange; see cluster.Cluster.PeerListener). A client token of any scope
// reaches none of them.

// peerServer serves the handler the API registers (ServePeer) on the
// node-to-node streams.
type peerServer struct {
	cfg      *Config
	cl       *cluster.Cluster // set once Raft runs
	peerHTTP *http.Client     // set once Raft runs (nil: an in-memory node)
	closing  <-chan struct{}
	mu       sync.Mutex
	h        http.Handler
	srv      *http.Server
	// own serves the node's own routes (under /internal/node/: the
	// state check), set before the server starts.
	own http.Handler
}

func (p *peerServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.own != nil && strings.HasPrefix(r.URL.Path, "/internal/node/") {
		p.own.ServeHTTP(w, r)
		return
	}
	p.mu.Lock()
	h := p.h
	p.mu.Unlock()
	if h == nil {
		// Not serving yet (between Open and the API's ServePeer): an
		// error that says nothing happened, as the forwarders read it.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"code":"UNAVAILABLE","message":"this server does not serve node-to-node requests yet; retry"}}`))
		return
	}
	h.ServeHTTP(w, r)
}

// start starts serving node-to-node requests, once.
func (ps *peerServer) start() {
	ln := ps.cl.PeerListener()
	if ln == nil {
		return
	}
	p := ps
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.srv != nil {
		return
	}
	select {
	case <-ps.closing:
		return
	default:
	}
	// Every node-to-node request is small and short (a control operation
	// bounded by its own timeout): a peer that trickles bytes or never
	// reads its answer loses its connection instead of holding a goroutine.
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: max(peerWriteTimeout, ps.cfg.hashWait(hashWaitAhead)+5*time.Second), IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 16 << 10}
	go p.srv.Serve(ln)
}

// peerWriteTimeout bounds a node-to-node request from the end of its
// headers to the end of its answer; it outlasts the leader's own bound on
// a control operation (10 s), and a state hash's wait (hashWait: longer
// with slow ticks).
const peerWriteTimeout = 20 * time.Second

// close stops serving node-to-node requests.
func (ps *peerServer) close() {
	if ps.peerHTTP != nil {
		ps.peerHTTP.CloseIdleConnections()
	}
	p := ps
	p.mu.Lock()
	srv := p.srv
	p.srv = nil
	p.h = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}
