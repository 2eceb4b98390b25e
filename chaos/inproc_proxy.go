package chaos

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// frontProxy is node i's address for the harness's clients: a TCP relay
// to the node's HTTP server, listening only while the node runs and is not
// isolated from clients.
type frontProxy struct {
	c    *InprocCluster
	i    int
	addr string

	mu       sync.Mutex
	l        net.Listener
	up       bool // the node runs
	isolated bool
	conns    map[net.Conn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

func newFrontProxy(c *InprocCluster, i int, addr string) (*frontProxy, error) {
	return &frontProxy{c: c, i: i, addr: addr, conns: map[net.Conn]struct{}{}}, nil
}

func (p *frontProxy) setUp(up bool) error {
	p.mu.Lock()
	p.up = up
	p.mu.Unlock()
	return p.sync()
}

func (p *frontProxy) setIsolated(iso bool) error {
	p.mu.Lock()
	p.isolated = iso
	p.mu.Unlock()
	return p.sync()
}

// sync opens or closes the listener to match the state.
func (p *frontProxy) sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	open := p.up && !p.isolated && !p.closed
	switch {
	case open && p.l == nil:
		l, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("chaos: front proxy of %s: %w", p.c.ids[p.i], err)
		}
		p.l = l
		p.wg.Add(1)
		go p.serve(l)
	case !open && p.l != nil:
		p.l.Close()
		p.l = nil
		for cn := range p.conns {
			cn.Close()
		}
	}
	return nil
}

func (p *frontProxy) serve(l net.Listener) {
	defer p.wg.Done()
	for {
		cn, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.relay(cn)
	}
}

func (p *frontProxy) relay(cn net.Conn) {
	defer p.wg.Done()
	up, err := p.c.net.dial(peerClient, p.c.apiAddr[p.i], p.c.nodeOf, func() (net.Conn, error) {
		return net.DialTimeout("tcp", p.c.apiAddr[p.i], 2*time.Second)
	})
	if err != nil {
		cn.Close()
		return
	}
	p.mu.Lock()
	if p.l == nil {
		p.mu.Unlock()
		cn.Close()
		up.Close()
		return
	}
	p.conns[cn], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	// Either side closing ends the relay (HTTP clients do not half-close).
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, cn)
	go pipe(cn, up)
	<-done
	cn.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, cn)
	delete(p.conns, up)
	p.mu.Unlock()
	cn.Close()
	up.Close()
}

func (p *frontProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.sync()
	p.wg.Wait()
}
