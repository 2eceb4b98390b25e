package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Meta is what a server tells the others about itself through gossip.
type Meta struct {
	ID          string `json:"id"`
	Raft        string `json:"raft"`
	HTTP        string `json:"http"`
	Version     string `json:"ver"`
	Incarnation string `json:"inc"`
	// Expect is the server's --bootstrap-expect (0 when it does not wait
	// to form a cluster).
	Expect int `json:"expect,omitempty"`
	// HasState: the server has Raft state (it belongs, or belonged, to a
	// cluster). A server with state never takes part in a bootstrap.
	HasState bool `json:"state,omitempty"`
	// ClusterID is the identity of the cluster whose Raft state the server
	// has; empty while it has none (or the cluster has no id yet).
	ClusterID string `json:"cid,omitempty"`

	// What the server's version supports; each is false (or empty) for
	// servers of versions before it.
	RaftHello     bool   `json:"hello,omitempty"`  // Raft connections start with the cluster id exchange (Identity)
	SealCheck     bool   `json:"seal,omitempty"`   // knows the SealCheck log entry
	ChunkedExpiry bool   `json:"chunk,omitempty"`  // reads limited ticks and Expire entries
	RestoreLog    bool   `json:"rlog,omitempty"`   // applies a restore through the log (RestoreChunk, RestoreCommit)
	EntryCRC      bool   `json:"crc,omitempty"`    // reads entries with a checksum (fsm.VersionChecked)
	Features      bool   `json:"feat,omitempty"`   // reads the features record (fsm.TypeFeatures)
	RenewMeta     bool   `json:"rmeta,omitempty"`  // reads renewals and heartbeats with metadata
	GrantKey      string `json:"gkey,omitempty"`   // grant signing public key (Ed25519, base64url); set: reads fsm.TypeMemberKey
	LeaseGroups   bool   `json:"groups,omitempty"` // reads lease group entries and snapshots with groups
	SessionMeta   bool   `json:"smeta,omitempty"`  // reads session heartbeats with metadata
	RestoreBounds bool   `json:"rbound,omitempty"` // reads restore commits with limits and a fence floor
	ChunkedPrune  bool   `json:"cprune,omitempty"` // reads ticks with a prune limit (fsm.TypeTickPruned)
}

// PeerStats is a server's view of Raft, carried in gossip ping acks.
type PeerStats struct {
	State     string `json:"s"`
	Term      uint64 `json:"t"`
	LastIndex uint64 `json:"i"`
	// LastContactMS is how long ago the server last heard from the leader
	// (0 on the leader itself, -1 when it never did).
	LastContactMS int64 `json:"c"`
	// DiskLow: the server's free disk space is below its --min-free-disk
	// (the leader then refuses writes that grow the state); DiskFree is
	// its free bytes (0 when unknown or not reported).
	DiskLow  bool  `json:"dl,omitempty"`
	DiskFree int64 `json:"df,omitempty"`
	// MemLimit is the memory the server holds a restore's estimate to
	// (its GOMEMLIMIT, its memory cgroup's limit, or its physical
	// memory), in bytes; 0 when unknown or not reported.
	MemLimit int64 `json:"ml,omitempty"`
}

// Peer is one server as gossip knows it.
type Peer struct {
	Meta
	// Addr is the gossip address.
	Addr string
	// Status is alive or failed (memberlist reports neither suspicion nor
	// tells a graceful leave from a failure: both are failed).
	Status string
	// Since is when Status last changed.
	Since time.Time
	// Stats and StatsAt: the server's last reported Raft view, if any.
	Stats   *PeerStats
	StatsAt time.Time
}

// GossipConfig configures memberlist discovery.
type GossipConfig struct {
	// Name is this server's id.
	Name string
	// BindAddr is host:port to listen on (UDP and TCP); port 0 picks one.
	BindAddr string
	// Advertise is the host the others reach this server at; empty means
	// the bind host, which must then not be unspecified.
	Advertise string
	// Meta returns this server's current metadata.
	Meta func() Meta
	// Stats returns this server's Raft view for ping acks.
	Stats func() PeerStats
	// LocalState is sent in push/pull exchanges; MergeState receives the
	// other side's.
	LocalState func() []byte
	MergeState func(buf []byte, join bool)
	// OnChange is called (without locks held) after membership changes.
	OnChange func()
	// Key enables gossip encryption (16, 24 or 32 bytes).
	Key []byte
	// Fast shortens probe and suspicion times (tests).
	Fast bool
	// WrapTransport, if set, wraps memberlist's UDP and TCP transport (bound
	// to BindAddr) for embedders that route, shape or observe gossip
	// themselves; it returns the transport memberlist uses.
	WrapTransport func(memberlist.NodeAwareTransport) memberlist.NodeAwareTransport
	Logger        *slog.Logger
}

// Gossip runs memberlist for one server.
type Gossip struct {
	cfg GossipConfig
	ml  *memberlist.Memberlist
	log *slog.Logger

	mu    sync.Mutex
	peers map[string]*Peer

	closeOnce  sync.Once
	closeErr   error
	refreshing atomic.Bool // Refresh runs
}

// StartGossip creates the memberlist and starts listening. Join is separate.
func StartGossip(cfg GossipConfig) (*Gossip, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	host, portStr, err := net.SplitHostPort(cfg.BindAddr)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip address %q: %v", ErrInvalidConfig, cfg.BindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip port %q", ErrInvalidConfig, portStr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	adv := cfg.Advertise
	if adv == "" {
		adv = host
	}
	if ip := net.ParseIP(adv); ip != nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("%w: gossip address %q is not reachable by peers; set an advertise address", ErrInvalidConfig, cfg.BindAddr)
	}
	g := &Gossip{cfg: cfg, log: cfg.Logger, peers: make(map[string]*Peer)}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = adv, port
	// Tuned for a LAN of a few servers: failures are noticed within a few
	// seconds; Raft decides leadership on its own, faster.
	mc.ProbeInterval = 500 * time.Millisecond
	mc.ProbeTimeout = 250 * time.Millisecond
	mc.PushPullInterval = 15 * time.Second
	// A server that comes back at another address takes over its old
	// entry once gossip has declared that one dead, instead of being
	// refused for 30 s. A live server's address is never taken.
	mc.DeadNodeReclaimTime = time.Second
	// A join to an unreachable address must not hold start-up or shutdown
	// for long.
	mc.TCPTimeout = 2 * time.Second
	if cfg.Fast {
		mc.ProbeInterval = 100 * time.Millisecond
		mc.ProbeTimeout = 50 * time.Millisecond
		mc.SuspicionMult = 2
		mc.GossipInterval = 20 * time.Millisecond
		mc.PushPullInterval = 2 * time.Second
	}
	mc.Delegate = (*gossipDelegate)(g)
	mc.Events = (*gossipEvents)(g)
	mc.Ping = (*gossipPing)(g)
	mc.Logger = log.New(&memberlistLog{l: cfg.Logger}, "", 0)
	if len(cfg.Key) > 0 {
		mc.SecretKey = cfg.Key
	}
	if cfg.WrapTransport != nil {
		nt, err := newNetTransport(host, port, mc.Logger)
		if err != nil {
			return nil, fmt.Errorf("cluster: gossip on %s: %w", cfg.BindAddr, err)
		}
		mc.BindPort, mc.AdvertisePort = nt.GetAutoBindPort(), nt.GetAutoBindPort()
		mc.Transport = cfg.WrapTransport(nt)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: gossip on %s: %w", cfg.BindAddr, err)
	}
	g.ml = ml
	return g, nil
}

// newNetTransport is memberlist's own UDP and TCP transport, retried a few
// times on port 0 as memberlist.Create does (UDP and TCP must get the same
// port).
func newNetTransport(host string, port int, logger *log.Logger) (*memberlist.NetTransport, error) {
	var err error
	for try := 0; try < 10; try++ {
		var nt *memberlist.NetTransport
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{host}, BindPort: port, Logger: logger})
		if err == nil || port != 0 {
			return nt, err
		}
	}
	return nil, err
}

// Alive counts the servers gossip sees alive or suspect, this one included.
func (g *Gossip) Alive() int { return g.ml.NumMembers() }

// Addr is the gossip address the others reach this server at.
func (g *Gossip) Addr() string { return g.ml.LocalNode().Address() }

// Join contacts the given gossip addresses (skipping this server's own) and
// reports how many answered.
func (g *Gossip) Join(addrs []string) (int, error) {
	self := g.Addr()
	var others []string
	for _, a := range addrs {
		if a != self && a != g.cfg.BindAddr {
			others = append(others, a)
		}
	}
	if len(others) == 0 {
		return 0, nil
	}
	return g.ml.Join(others)
}

// ErrGossipClosed: JoinWithin was stopped before any server answered.
var ErrGossipClosed = errors.New("cluster: stopped before joining")

// JoinWithin joins gossip through addrs, trying again every 500 ms until
// one answers, timeout passes, or stop is closed (ErrGossipClosed).
func (g *Gossip) JoinWithin(addrs []string, timeout time.Duration, stop <-chan struct{}) error {
	deadline := time.Now().Add(timeout)
	for {
		joined, err := g.Join(addrs)
		if joined > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("could not join any of %v within %v: %v", addrs, timeout, err)
		}
		g.log.Info("waiting for other servers to answer gossip", "join", addrs, "err", err)
		select {
		case <-time.After(500 * time.Millisecond):
		case <-stop:
			return ErrGossipClosed
		}
	}
}

// Refresh exchanges state with addrs and the alive servers, in the
// background (one exchange at a time; a paused peer can hold one for
// gossip's TCP timeout). done, if set, runs when the exchange ends.
func (g *Gossip) Refresh(addrs []string, self string, done func()) bool {
	if !g.refreshing.CompareAndSwap(false, true) {
		return false
	}
	addrs = append([]string(nil), addrs...)
	for _, p := range g.Peers() {
		if p.Status == "alive" && p.ID != self && p.Addr != "" {
			addrs = append(addrs, p.Addr)
		}
	}
	if len(addrs) == 0 {
		g.refreshing.Store(false)
		return false
	}
	go func() {
		defer g.refreshing.Store(false)
		if done != nil {
			defer done()
		}
		g.Join(addrs)
	}()
	return true
}

// UpdateMeta re-announces this server's metadata.
func (g *Gossip) UpdateMeta() {
	if err := g.ml.UpdateNode(time.Second); err != nil {
		g.log.Debug("gossip metadata update", "err", err)
	}
}

// Peers returns every server gossip knows of, this one included, by id.
func (g *Gossip) Peers() []Peer {
	g.mu.Lock()
	out := make([]Peer, 0, len(g.peers))
	for _, p := range g.peers {
		out = append(out, *p)
	}
	g.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Peer returns one server by id.
func (g *Gossip) Peer(id string) (Peer, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.peers[id]
	if !ok {
		return Peer{}, false
	}
	return *p, true
}

// Close leaves the gossip pool (briefly) and stops.
func (g *Gossip) Close() error {
	g.closeOnce.Do(func() {
		if err := g.ml.Leave(500 * time.Millisecond); err != nil {
			g.log.Debug("gossip leave", "err", err)
		}
		g.closeErr = g.ml.Shutdown()
	})
	return g.closeErr
}

// update records a memberlist node with its status and calls OnChange.
// The status comes from the callback, not from n.State: memberlist never
// sets Node.State (it keeps the state beside the node), so n.State reads
// alive even in NotifyLeave.
func (g *Gossip) update(n *memberlist.Node, status string) {
	var m Meta
	if len(n.Meta) > 0 {
		if err := json.Unmarshal(n.Meta, &m); err != nil {
			g.log.Warn("gossip: undecodable metadata; ignoring the node", "node", n.Name, "err", err)
			return
		}
	}
	if m.ID == "" {
		m.ID = n.Name
	}
	g.mu.Lock()
	p := g.peers[n.Name]
	if p == nil {
		p = &Peer{}
		g.peers[n.Name] = p
	}
	if p.Status != status {
		p.Since = time.Now()
	}
	p.Meta, p.Addr, p.Status = m, n.Address(), status
	g.mu.Unlock()
	if g.cfg.OnChange != nil {
		g.cfg.OnChange()
	}
}

type gossipDelegate Gossip

func (d *gossipDelegate) NodeMeta(limit int) []byte {
	if d.cfg.Meta == nil {
		return nil
	}
	b, _ := json.Marshal(d.cfg.Meta())
	if len(b) > limit {
		d.log.Error("gossip: metadata too large", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}

func (d *gossipDelegate) NotifyMsg([]byte)                {}
func (d *gossipDelegate) GetBroadcasts(int, int) [][]byte { return nil }

func (d *gossipDelegate) LocalState(bool) []byte {
	if d.cfg.LocalState == nil {
		return nil
	}
	return d.cfg.LocalState()
}

func (d *gossipDelegate) MergeRemoteState(buf []byte, join bool) {
	if d.cfg.MergeState != nil && len(buf) > 0 {
		d.cfg.MergeState(buf, join)
	}
}

type gossipEvents Gossip

func (e *gossipEvents) NotifyJoin(n *memberlist.Node)   { (*Gossip)(e).update(n, "alive") }
func (e *gossipEvents) NotifyUpdate(n *memberlist.Node) { (*Gossip)(e).update(n, "alive") }

// NotifyLeave: memberlist calls it both for a server it declared dead and
// for one that left gracefully, and does not say which; both are "failed"
// here (a server that left is gone all the same).
func (e *gossipEvents) NotifyLeave(n *memberlist.Node) { (*Gossip)(e).update(n, "failed") }

type gossipPing Gossip

func (p *gossipPing) AckPayload() []byte {
	if p.cfg.Stats == nil {
		return nil
	}
	b, _ := json.Marshal(p.cfg.Stats())
	return b
}

func (p *gossipPing) NotifyPingComplete(other *memberlist.Node, _ time.Duration, payload []byte) {
	if len(payload) == 0 {
		return
	}
	var st PeerStats
	if err := json.Unmarshal(payload, &st); err != nil {
		return
	}
	p.mu.Lock()
	if peer := p.peers[other.Name]; peer != nil {
		peer.Stats, peer.StatsAt = &st, time.Now()
	}
	p.mu.Unlock()
}

// memberlistLog turns memberlist's "[LEVEL] memberlist: ..." lines into
// slog records.
type memberlistLog struct{ l *slog.Logger }

func (w *memberlistLog) Write(b []byte) (int, error) {
	lv, msg := parseStdLine(b)
	w.l.Log(context.Background(), slogLevel(lv), msg, "component", "gossip")
	return len(b), nil
}
