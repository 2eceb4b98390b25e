package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/internal/ctxtime"
)

// Env is what a scenario's nemesis works with: the cluster, the history (to
// note its actions), a seeded random source and admin requests.
type Env struct {
	C    Cluster
	H    *History
	Rng  *rand.Rand
	Tier string

	mu      sync.Mutex
	admin   []*client.Client // one per node, stale reads (local views)
	counts  map[string]int
	removed map[int]bool
	// damaged are the nodes whose data a nemesis damaged on purpose
	// (bitflip): their refusals are expected in their logs.
	damaged map[int]bool
}

func newEnv(c Cluster, h *History, seed uint64, tier string) (*Env, error) {
	e := &Env{C: c, H: h, Rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), Tier: tier,
		counts: map[string]int{}, removed: map[int]bool{}, damaged: map[int]bool{}}
	for i := 0; i < c.Size(); i++ {
		cl, err := client.New([]string{c.HTTPAddr(i)}, client.Options{Timeout: 2 * time.Second, StaleReads: true})
		if err != nil {
			return nil, err
		}
		e.admin = append(e.admin, cl)
	}
	return e, nil
}

// Count adds to a named effectiveness counter (e.g. "restarts").
func (e *Env) Count(name string, n int) {
	e.mu.Lock()
	e.counts[name] += n
	e.mu.Unlock()
}

func (e *Env) countsCopy() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for k, v := range e.counts {
		out[k] = v
	}
	return out
}

// Admin is a client to node i that reads its local view.
func (e *Env) Admin(i int) *client.Client { return e.admin[i] }

// Leader finds the node that believes it leads with the highest term, among
// the nodes that are alive and answer. -1 if none does.
func (e *Env) Leader(ctx context.Context) int {
	best, term := -1, uint64(0)
	for i := 0; i < e.C.Size(); i++ {
		if !e.C.Alive(i) {
			continue
		}
		st, err := e.admin[i].Cluster(ctx)
		if err != nil || !strings.EqualFold(st.State, "leader") {
			continue
		}
		if best < 0 || st.Term > term {
			best, term = i, st.Term
		}
	}
	return best
}

// WaitLeader waits up to d for a leader among the nodes.
func (e *Env) WaitLeader(ctx context.Context, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		if l := e.Leader(ctx); l >= 0 {
			return l, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no leader within %v", d)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return -1, err
		}
	}
}

// Others returns every node but the given ones.
func (e *Env) Others(not ...int) []int {
	var out []int
outer:
	for i := 0; i < e.C.Size(); i++ {
		for _, n := range not {
			if i == n {
				continue outer
			}
		}
		out = append(out, i)
	}
	return out
}

// Fault applies a fault, notes the window, holds it for d and undoes it.
// An ErrUnsupported from apply is returned as is (the scenario is skipped
// on this tier).
func (e *Env) Fault(ctx context.Context, name, detail string, d time.Duration, apply, undo func() error) error {
	return e.fault(ctx, name, detail, false, d, apply, undo)
}

// FaultNoQuorum is Fault for a fault that leaves no healthy majority: the
// liveness checker excuses its window.
func (e *Env) FaultNoQuorum(ctx context.Context, name, detail string, d time.Duration, apply, undo func() error) error {
	return e.fault(ctx, name, detail, true, d, apply, undo)
}

func (e *Env) fault(ctx context.Context, name, detail string, noQuorum bool, d time.Duration, apply, undo func() error) error {
	if err := apply(); err != nil {
		e.H.Note(Event{Type: "nemesis", Name: name, Phase: "start", Detail: detail, Err: err.Error(), NoQuorum: noQuorum})
		return err
	}
	e.H.Note(Event{Type: "nemesis", Name: name, Phase: "start", Detail: detail, NoQuorum: noQuorum})
	e.Count("faults", 1)
	serr := sleepCtx(ctx, d)
	var uerr error
	if undo != nil {
		uerr = undo()
	}
	ev := Event{Type: "nemesis", Name: name, Phase: "stop", Detail: detail, NoQuorum: noQuorum}
	if uerr != nil {
		ev.Err = uerr.Error()
	}
	e.H.Note(ev)
	if serr != nil {
		return serr
	}
	return uerr
}

// Note records a nemesis action without a window.
func (e *Env) Note(name, detail string, err error) {
	ev := Event{Type: "nemesis", Name: name, Detail: detail}
	if err != nil {
		ev.Err = err.Error()
	}
	e.H.Note(ev)
}

// LocalState is a node's own view, from GET /v1/cluster/local.
type LocalState struct {
	NodeID             string `json:"node_id"`
	State              string `json:"state"`
	Term               uint64 `json:"term"`
	CommitIndex        uint64 `json:"commit_index"`
	AppliedIndex       uint64 `json:"applied_index"`
	LastIndex          uint64 `json:"last_index"`
	StateHash          string `json:"state_hash"`
	SnapshotsInstalled int    `json:"snapshots_installed"`
}

// Local reads node i's local state; hashAt > 0 asks for the state hash
// right after applying that index (the node waits up to timeout).
func (e *Env) Local(ctx context.Context, i int, hashAt uint64, timeout time.Duration) (*LocalState, error) {
	u := "http://" + e.C.HTTPAddr(i) + "/v1/cluster/local"
	if hashAt > 0 {
		u += "?hash_at=" + strconv.FormatUint(hashAt, 10) + "&timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("node %d: GET /v1/cluster/local: %s: %s", i, resp.Status, truncate(string(b), 300))
	}
	var ls LocalState
	if err := json.Unmarshal(b, &ls); err != nil {
		return nil, fmt.Errorf("node %d: /v1/cluster/local: %w", i, err)
	}
	return &ls, nil
}

// sleepCtx sleeps for d, or until ctx ends (its error).
var sleepCtx = ctxtime.Sleep

// leaderWatch polls every node's local view and notes leader changes.
func (e *Env) leaderWatch(ctx context.Context, every time.Duration) {
	last := ""
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l := e.Leader(ctx)
		id := ""
		if l >= 0 {
			id = e.C.NodeID(l)
		}
		if id != "" && id != last {
			if last != "" {
				e.Count("leader-changes", 1)
			}
			e.H.Note(Event{Type: "leader", Name: id, Detail: fmt.Sprintf("node %d", l)})
			last = id
		}
	}
}
