//go:build linux

package chaos

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// delayProxies forward the Raft connections of delayed nodes. Kernels here
// have no netem, so node a's Raft connections to peer b are redirected (nft
// DNAT in a's namespace) to a listener of the ordered pair (a, b) on the
// proxy address; it dials b's Raft port and forwards both ways, holding
// each chunk a sent for a's delay and each chunk b answered for b's delay.
type delayProxies struct {
	c      *NetnsCluster
	delays []atomic.Int64 // nanoseconds, per node
	rates  []atomic.Int64 // bytes per second, per ordered pair (a*n+b); 0: no cap
	pairs  map[[2]int]*pairProxy
}

type pairProxy struct {
	p     *delayProxies
	a, b  int
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func newDelayProxies(c *NetnsCluster) *delayProxies {
	return &delayProxies{c: c, delays: make([]atomic.Int64, c.opts.Nodes), rates: make([]atomic.Int64, c.opts.Nodes*c.opts.Nodes),
		pairs: map[[2]int]*pairProxy{}}
}

// sync sets the delays and opens the listeners f needs (before the rules
// redirect to them); prune closes the ones it no longer needs (after the
// rules stopped redirecting). Called with c.mu held.
func (p *delayProxies) sync(f *faultState) error {
	for i := range p.delays {
		p.delays[i].Store(int64(f.delay[i]))
		for j := range f.n {
			p.rates[i*f.n+j].Store(f.rate[i][j])
		}
	}
	for a := range f.n {
		for b := range f.n {
			if !f.proxied(a, b) || p.pairs[[2]int{a, b}] != nil {
				continue
			}
			addr := net.JoinHostPort(p.c.proxyIP, strconv.Itoa(proxyPort(a, b)))
			ln, err := net.Listen("tcp4", addr)
			if err != nil {
				return err
			}
			pp := &pairProxy{p: p, a: a, b: b, ln: ln, conns: map[net.Conn]struct{}{}}
			p.pairs[[2]int{a, b}] = pp
			pp.wg.Add(1)
			go pp.accept()
		}
	}
	return nil
}

func (p *delayProxies) prune(f *faultState) {
	for k, pp := range p.pairs {
		if !f.proxied(k[0], k[1]) {
			pp.close()
			delete(p.pairs, k)
		}
	}
}

func (p *delayProxies) closeAll() {
	for k, pp := range p.pairs {
		pp.close()
		delete(p.pairs, k)
	}
}

// close stops the listener and every connection, and waits (at most 5 s)
// for the forwarding goroutines.
func (pp *pairProxy) close() {
	pp.ln.Close()
	pp.mu.Lock()
	for c := range pp.conns {
		c.Close()
	}
	pp.mu.Unlock()
	done := make(chan struct{})
	go func() { pp.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		pp.p.c.log.Warn("delay proxy goroutines still running after 5s", "from", pp.a, "to", pp.b)
	}
}

func (pp *pairProxy) track(c net.Conn) bool {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.conns == nil {
		return false
	}
	pp.conns[c] = struct{}{}
	return true
}

func (pp *pairProxy) accept() {
	defer pp.wg.Done()
	for {
		in, err := pp.ln.Accept()
		if err != nil {
			pp.mu.Lock()
			for c := range pp.conns {
				c.Close()
			}
			pp.conns = nil // closed: track refuses from now on
			pp.mu.Unlock()
			return
		}
		pp.wg.Add(1)
		go pp.serve(in)
	}
}

func (pp *pairProxy) serve(in net.Conn) {
	defer pp.wg.Done()
	if !pp.track(in) {
		in.Close()
		return
	}
	if tc, ok := in.(*net.TCPConn); ok && pp.p.rates[pp.a*len(pp.p.delays)+pp.b].Load() > 0 {
		// A throttled link: a small receive window, so that what the
		// sender has not had read stays on its side (its socket's send
		// buffer stays small too), as it would behind a slow link.
		_ = tc.SetReadBuffer(32 << 10)
	}
	c := pp.p.c
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.proxyIP)}}
	out, err := d.Dial("tcp4", net.JoinHostPort(c.nodeIP(pp.b), strconv.Itoa(netnsRaftPort)))
	if err != nil {
		in.Close()
		return
	}
	if !pp.track(out) {
		in.Close()
		out.Close()
		return
	}
	closed := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(closed)
			in.Close()
			out.Close()
			pp.mu.Lock()
			if pp.conns != nil {
				delete(pp.conns, in)
				delete(pp.conns, out)
			}
			pp.mu.Unlock()
		})
	}
	var wg sync.WaitGroup
	wg.Add(2)
	n := len(pp.p.delays)
	go func() { defer wg.Done(); pump(out, in, &pp.p.delays[pp.a], &pp.p.rates[pp.a*n+pp.b], closed, stop) }()
	go func() { defer wg.Done(); pump(in, out, &pp.p.delays[pp.b], &pp.p.rates[pp.b*n+pp.a], closed, stop) }()
	wg.Wait()
}

// pump copies src to dst, each chunk written delay after it was read (the
// delay current when it was read). Under a rate cap it reads a twentieth
// of a second's worth at a time and waits out each read's share of the
// second before the next, so that what the sender has not yet got read
// stays in its own socket and process (lost if it dies). Either side
// failing stops both.
func pump(dst, src net.Conn, delay, rate *atomic.Int64, closed <-chan struct{}, stop func()) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 256) // at most 256 chunks in flight: back-pressure
	go func() {
		defer close(ch)
		for {
			size := 32 << 10
			r := rate.Load()
			if r > 0 {
				size = int(min(max(r/20, 256), int64(size)))
			}
			buf := make([]byte, size)
			n, err := src.Read(buf)
			if n > 0 && r > 0 {
				t := time.NewTimer(time.Duration(int64(n) * int64(time.Second) / r))
				select {
				case <-t.C:
				case <-closed:
					t.Stop()
					return
				}
			}
			if n > 0 {
				select {
				case ch <- chunk{buf[:n], time.Now().Add(time.Duration(delay.Load()))}:
				case <-closed:
					return
				}
			}
			if err != nil {
				return // the writer drains what was read, then stops both
			}
		}
	}()
	defer stop()
	for ck := range ch {
		if w := time.Until(ck.due); w > 0 {
			t := time.NewTimer(w)
			select {
			case <-t.C:
			case <-closed:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(ck.b); err != nil {
			return
		}
	}
}
