package chaos

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/anishathalye/porcupine"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// ClusterFactory starts a cluster of the given size for one run, writing
// its logs and data under dir.
type ClusterFactory func(ctx context.Context, nodes int, dir string, s *Scenario) (Cluster, error)

// RunConfig is one run of one scenario.
type RunConfig struct {
	Scenario *Scenario
	Seed     uint64
	// Dir is the run's output directory (created).
	Dir  string
	Tier string
	New  ClusterFactory
	// Workload shapes the clients; Prefix and Eps are filled in.
	Workload WorkloadConfig
	// Warmup runs the workload before the nemesis (default 3 s); Recovery
	// after it (default 4 s).
	Warmup, Recovery time.Duration
	// Eps is the TTL safety fraction (default 0.01, or the scenario's).
	Eps float64
	// CheckTimeout bounds the linearizability search (default 60 s).
	CheckTimeout time.Duration
	// MinOpsBeforeFault is the effectiveness floor of successful
	// operations before the first fault (default 30).
	MinOpsBeforeFault int
	// KeepData keeps the data directories even when the run passes.
	KeepData bool
	// Progress, if set, gets one line per phase.
	Progress io.Writer
}

// Summary is a run's outcome, written to summary.json.
type Summary struct {
	Scenario string `json:"scenario"`
	Class    string `json:"class"`
	Tier     string `json:"tier"`
	Seed     uint64 `json:"seed"`
	// Valid is true when every checker passed; a skipped run is valid but
	// says why it was skipped.
	Valid    bool      `json:"valid"`
	Skipped  string    `json:"skipped,omitempty"`
	Error    string    `json:"error,omitempty"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Ops      int       `json:"ops"`
	OK       int       `json:"ok"`
	Fail     int       `json:"fail"`
	Info     int       `json:"info"`
	InfoRate float64   `json:"indeterminate_share"`
	// LeaderChanges as the harness observed them.
	LeaderChanges int            `json:"leader_changes"`
	Counts        map[string]int `json:"counts"`
	Verdicts      []Verdict      `json:"verdicts"`
	Dir           string         `json:"dir"`
	Replay        string         `json:"replay"`
}

// Failed lists the checkers that did not pass.
func (s *Summary) Failed() []string {
	var out []string
	for _, v := range s.Verdicts {
		if !v.Valid {
			out = append(out, v.Checker)
		}
	}
	return out
}

// Run runs one scenario and checks its history. The error is for the
// harness failing to run at all; checker failures are in the summary.
func Run(ctx context.Context, rc RunConfig) (*Summary, error) {
	s := rc.Scenario
	rc.defaults()
	progress := func(format string, args ...any) {
		if rc.Progress != nil {
			fmt.Fprintf(rc.Progress, "chaos: %s: "+format+"\n", append([]any{s.Name}, args...)...)
		}
	}
	if err := os.MkdirAll(rc.Dir, 0o755); err != nil {
		return nil, err
	}
	sum := newSummary(rc)
	h, err := NewHistory(filepath.Join(rc.Dir, "history.jsonl"))
	if err != nil {
		return nil, err
	}
	defer h.Close()

	progress("starting %d nodes (seed %d)", s.nodes(), rc.Seed)
	c, err := rc.New(ctx, s.nodes(), rc.Dir, s)
	if err != nil {
		sum.Error = "cluster: " + err.Error()
		sum.Verdicts = append(sum.Verdicts, Verdict{Checker: "setup", Detail: sum.Error})
		return sum, writeSummary(sum)
	}
	keep := rc.KeepData
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Close(cctx, keep || !sum.Valid)
	}()
	env, err := newEnv(c, h, rc.Seed, rc.Tier)
	if err != nil {
		return nil, err
	}
	stopWatch := startLeaderWatch(ctx, env)
	defer stopWatch()
	cfgCtx, stopCfg := context.WithCancel(ctx)
	defer stopCfg()
	var cfgWatch *configWatch
	if s.Configuration {
		cfgWatch = env.watchConfig(cfgCtx, 200*time.Millisecond)
	}
	stopLoad, err := startLoad(ctx, c, h, rc)
	if err != nil {
		return nil, err
	}

	progress("warm-up %v", rc.Warmup)
	_ = sleepCtx(ctx, rc.Warmup)
	okBefore := countOK(h.Ops())
	progress("nemesis %s", s.Class)
	h.Note(Event{Type: "note", Name: "nemesis-begin"})
	nerr := s.Nemesis(ctx, env)
	h.Note(Event{Type: "note", Name: "nemesis-end"})
	healAll(c, env)
	if errors.Is(nerr, ErrUnsupported) {
		stopLoad()
		sum.Valid = true
		sum.Skipped = fmt.Sprintf("the %s tier cannot inject this fault: %v", rc.Tier, nerr)
		progress("skipped: %s", sum.Skipped)
		fill(sum, h, env)
		return sum, writeSummary(sum)
	}
	progress("recovery %v", rc.Recovery)
	_ = sleepCtx(ctx, rc.Recovery)
	stopLoad()
	stopWatch()
	stopCfg()
	end := h.Now()

	progress("checking")
	ops := h.Ops()
	verdicts, info, windows := check(ctx, c, env, h, rc, nerr, end)
	if cfgWatch != nil {
		verdicts = append(verdicts, env.checkConfig(cfgWatch))
	}
	verdicts = append(verdicts, checkEffective(s, env, okBefore, rc.MinOpsBeforeFault))
	sum.Verdicts = verdicts
	sum.Valid = allValid(verdicts)
	fill(sum, h, env)
	writeRunFiles(rc, info, windows, h.Events(), ops, end, progress)
	if sum.Valid {
		progress("PASS: %d ops (%d ok, %.1f%% indeterminate), %d leader changes", sum.Ops, sum.OK, 100*sum.InfoRate, sum.LeaderChanges)
	} else {
		progress("FAIL: %s (see %s)", strings.Join(sum.Failed(), ", "), rc.Dir)
	}
	return sum, writeSummary(sum)
}

// newSummary is the summary of rc's run as it starts: no verdicts yet.
func newSummary(rc RunConfig) *Summary {
	s := rc.Scenario
	return &Summary{Scenario: s.Name, Class: s.Class, Tier: rc.Tier, Seed: rc.Seed, Started: time.Now(),
		Counts: map[string]int{}, Dir: rc.Dir,
		Replay: fmt.Sprintf("leasehold-chaos --tier %s --scenario %s --seed %d", rc.Tier, s.Name, rc.Seed)}
}

// startLeaderWatch runs env's leader watch until the returned stop, which
// waits for it to end (stop may be called more than once).
func startLeaderWatch(ctx context.Context, env *Env) (stop func()) {
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	watchWG.Add(1)
	go func() { defer watchWG.Done(); env.leaderWatch(watchCtx, 100*time.Millisecond) }()
	return func() { stopWatch(); watchWG.Wait() }
}

// allValid reports whether every verdict is valid.
func allValid(verdicts []Verdict) bool {
	for _, v := range verdicts {
		if !v.Valid {
			return false
		}
	}
	return true
}

// writeRunFiles writes the linearizability visualization and the timeline
// into the run's directory; a failure is only reported as progress.
func writeRunFiles(rc RunConfig, info porcupine.LinearizationInfo, windows []window, evs []Event, ops []Op, end int64, progress func(string, ...any)) {
	if err := writeVisualization(filepath.Join(rc.Dir, "linearizability.html"), rc.Eps, info, evs, end); err != nil {
		progress("visualization: %v", err)
	}
	if err := writeTimeline(rc.Dir, windows, evs, ops, end); err != nil {
		progress("timeline: %v", err)
	}
}

// defaults fills in what rc leaves zero.
func (rc *RunConfig) defaults() {
	rc.Warmup = cmp.Or(rc.Warmup, 3*time.Second)
	rc.Recovery = cmp.Or(rc.Recovery, 4*time.Second)
	if rc.Eps == 0 {
		rc.Eps = 0.01
		if rc.Scenario.Eps > 0 {
			rc.Eps = rc.Scenario.Eps
		}
	}
	rc.CheckTimeout = cmp.Or(rc.CheckTimeout, 60*time.Second)
	rc.MinOpsBeforeFault = cmp.Or(rc.MinOpsBeforeFault, 30)
}

// startLoad starts the workloads (lease and counter workers) and the tick
// sampler against c; the function it returns stops them and waits.
func startLoad(ctx context.Context, c Cluster, h *History, rc RunConfig) (func(), error) {
	wc := rc.Workload
	wc.Prefix = fmt.Sprintf("chaos-%d", rc.Seed)
	wc.Eps = rc.Eps
	wc.defaults()
	cls, err := newClients(c, wc.OpTimeout)
	if err != nil {
		return nil, err
	}
	res := NewFencedResource()
	wctx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	keys := &keyRing{prefix: wc.Prefix, keys: wc.Keys, every: wc.RotateEvery}
	for i := 0; i < wc.LeaseWorkers; i++ {
		w := &leaseWorker{id: i, cfg: &wc, h: h, cl: cls, keys: keys,
			rng: rand.New(rand.NewPCG(rc.Seed, uint64(i)+1))}
		wg.Add(1)
		go func() { defer wg.Done(); w.run(wctx) }()
	}
	for i := 0; i < wc.CounterWorkers; i++ {
		id := wc.LeaseWorkers + i
		w := &counterWorker{leaseWorker: leaseWorker{id: id, cfg: &wc, h: h, cl: cls, keys: keys,
			rng: rand.New(rand.NewPCG(rc.Seed, uint64(id)+1))}, res: res}
		wg.Add(1)
		go func() { defer wg.Done(); w.run(wctx) }()
	}
	tctx, stopTicks := context.WithCancel(ctx)
	var tickWG sync.WaitGroup
	tickWG.Add(1)
	go func() { defer tickWG.Done(); sampleTicks(tctx, h, cls, rand.New(rand.NewPCG(rc.Seed, 99))) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			stopWork()
			wg.Wait()
			stopTicks()
			tickWG.Wait()
		})
	}, nil
}

// healAll undoes whatever a nemesis left: network faults, pauses, clock
// rates, disk faults, and restarts a node it left down.
func healAll(c Cluster, env *Env) {
	_ = c.Heal()
	for i := 0; i < c.Size(); i++ {
		_ = c.Resume(i)
		_ = c.ClockRate(i, 1)
		_ = c.DiskFault(i, false, 0)
		if !c.Alive(i) {
			if err := c.Restart(i); err == nil {
				env.Count("restarts", 1)
			}
		}
	}
}

// check runs every checker on the run's history (and on the cluster, for
// recovery, lost acknowledgments, convergence and logs).
func check(ctx context.Context, c Cluster, env *Env, h *History, rc RunConfig, nerr error, end int64) ([]Verdict, porcupine.LinearizationInfo, []window) {
	ops := h.Ops()
	var verdicts []Verdict
	if nerr != nil {
		name := "nemesis"
		var g *guardError
		if errors.As(nerr, &g) {
			name = g.checker // the scenario's own check failed, not its faults
		}
		verdicts = append(verdicts, Verdict{Checker: name, Detail: "the nemesis failed: " + nerr.Error()})
	}
	verdicts = append(verdicts, checkRecovery(ctx, c, env, h))
	verdicts = append(verdicts, CheckNoLostAcks(ctx, ops, lookupVia(c)))
	verdicts = append(verdicts, checkConvergence(ctx, c, env))
	logs := readLogs(c)
	for i := range env.damaged {
		if p := c.LogPath(i); p != "" {
			if l, ok := logs[filepath.Base(p)]; ok {
				logs[filepath.Base(p)] = withoutDamage(l)
			}
		}
	}
	verdicts = append(verdicts, CheckLogs(logs))
	lin, info := CheckLinearizable(ops, rc.Eps, rc.CheckTimeout)
	verdicts = append(verdicts, lin)
	hw, windows := CheckHolderWindows(ops, rc.Eps, end)
	verdicts = append(verdicts, hw)
	verdicts = append(verdicts, CheckFencing(ops))
	verdicts = append(verdicts, CheckClock(ops, rc.Eps))
	if rc.Scenario.Liveness {
		verdicts = append(verdicts, CheckLiveness(ops, h.Events(), rc.Scenario.stallBound(), end))
	}
	ctr := CheckCounter(ops)
	verdicts = append(verdicts, ctr)
	env.Count("stale-token-rejected", ctr.Counts["stale-token-rejected"])
	return verdicts, info, windows
}

func countOK(ops []Op) int {
	n := 0
	for _, o := range ops {
		if o.Status == StatusOK && o.Node >= 0 {
			n++
		}
	}
	return n
}

func fill(sum *Summary, h *History, env *Env) {
	for _, o := range h.Ops() {
		if o.Node < 0 {
			continue // the fenced resource, not the cluster
		}
		sum.Ops++
		switch o.Status {
		case StatusOK:
			sum.OK++
		case StatusFail:
			sum.Fail++
		default:
			sum.Info++
		}
	}
	if sum.Ops > 0 {
		sum.InfoRate = float64(sum.Info) / float64(sum.Ops)
	}
	sum.Counts = env.countsCopy()
	sum.LeaderChanges = sum.Counts["leader-changes"]
	sum.Seconds = time.Since(sum.Started).Seconds()
}

func writeSummary(sum *Summary) error {
	if sum.Seconds == 0 {
		sum.Seconds = time.Since(sum.Started).Seconds()
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(sum.Dir, "summary.json"), append(b, '\n'), 0o644)
}

// checkRecovery: after healing, a leader and a successful write within 30 s.
func checkRecovery(ctx context.Context, c Cluster, env *Env, h *History) Verdict {
	v := Verdict{Checker: "recovery", Valid: true, Counts: map[string]int{}}
	start := time.Now()
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.HTTPAddr(i))
	}
	cl, err := client.New(addrs, client.Options{Timeout: 3 * time.Second})
	if err != nil {
		v.fail("client: %v", err)
		return v
	}
	deadline := start.Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		l, err := cl.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("chaos-recovery/%d", h.Now()), Holder: "recovery", TTLMS: 1000})
		if err == nil {
			_, err = cl.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
		}
		if err == nil && env.Leader(ctx) >= 0 {
			v.Counts["ms"] = int(time.Since(start).Milliseconds())
			v.Detail = fmt.Sprintf("a leader and a successful write %d ms after healing", v.Counts["ms"])
			return v
		}
		last = err
		_ = sleepCtx(ctx, 200*time.Millisecond)
	}
	v.fail("no leader with a successful write within 30 s of healing: %v", last)
	v.Detail = "no recovery"
	return v
}

func lookupVia(c Cluster) LeaseLookup {
	var addrs []string
	for i := 0; i < c.Size(); i++ {
		addrs = append(addrs, c.HTTPAddr(i))
	}
	cl, _ := client.New(addrs, client.Options{Timeout: 3 * time.Second})
	return func(ctx context.Context, id string) (string, uint64, bool, error) {
		var last error
		for try := 0; try < 5; try++ {
			l, err := cl.Get(ctx, id)
			if err == nil {
				return l.State, l.FencingToken, true, nil
			}
			if client.ErrorCode(err) == wire.CodeLeaseNotFound {
				return "", 0, false, nil
			}
			last = err
			_ = sleepCtx(ctx, 300*time.Millisecond)
		}
		return "", 0, false, last
	}
}

// checkConvergence: after healing, every node reaches the same state hash
// at the same applied index.
func checkConvergence(ctx context.Context, c Cluster, env *Env) Verdict {
	v := Verdict{Checker: "convergence", Valid: true, Counts: map[string]int{}}
	var target uint64
	var alive []int
	for i := 0; i < c.Size(); i++ {
		if !c.Alive(i) {
			continue
		}
		alive = append(alive, i)
		if ls, err := env.Local(ctx, i, 0, time.Second); err == nil && ls.AppliedIndex > target {
			target = ls.AppliedIndex
		}
	}
	if target == 0 {
		v.fail("no node reported its applied index")
		return v
	}
	// Ticks keep the log moving: about 10 entries a second.
	target += 30
	type res struct {
		i   int
		ls  *LocalState
		err error
	}
	out := make([]res, len(alive))
	var wg sync.WaitGroup
	for k, i := range alive {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := env.Local(ctx, i, target, 20*time.Second)
			out[k] = res{i, ls, err}
		}()
	}
	wg.Wait()
	hashes := map[string][]int{}
	for _, r := range out {
		if r.err != nil {
			v.fail("node %d: %v", r.i, r.err)
			continue
		}
		hashes[r.ls.StateHash] = append(hashes[r.ls.StateHash], r.i)
		v.Counts["nodes"]++
		v.Counts["snapshots-installed"] += r.ls.SnapshotsInstalled
	}
	if len(hashes) > 1 {
		var parts []string
		for hsh, ns := range hashes {
			parts = append(parts, fmt.Sprintf("%v: %s", ns, truncate(hsh, 16)))
		}
		sort.Strings(parts)
		v.fail("state hashes differ at index %d: %s", target, strings.Join(parts, "; "))
	}
	if v.Valid {
		v.Detail = fmt.Sprintf("%d nodes have the same state hash at index %d", v.Counts["nodes"], target)
	}
	return v
}

func readLogs(c Cluster) map[string]string {
	out := map[string]string{}
	for i := 0; i < c.Size(); i++ {
		p := c.LogPath(i)
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		out[filepath.Base(p)] = string(b)
	}
	return out
}

// checkEffective fails a run whose faults did not do what the scenario
// needs them to do: a scenario that did not change the leader proves
// nothing about leader changes.
func checkEffective(s *Scenario, env *Env, okBefore, minOps int) Verdict {
	v := Verdict{Checker: "effectiveness", Valid: true, Counts: env.countsCopy()}
	v.Counts["ok-before-fault"] = okBefore
	if okBefore < minOps {
		v.fail("only %d successful operations before the first fault (want >= %d)", okBefore, minOps)
	}
	names := make([]string, 0, len(s.Expect))
	for k := range s.Expect {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if got := v.Counts[k]; got < s.Expect[k] {
			v.fail("%s: %d, the scenario needs at least %d", k, got, s.Expect[k])
		}
	}
	if v.Valid {
		v.Detail = "the faults had the effects the scenario needs"
	} else {
		v.Detail = "ineffective run"
	}
	return v
}

// sampleTicks reads the cluster clock linearizably every 100 ms through a
// random node (a follower forwards to the leader) for the clock checker.
func sampleTicks(ctx context.Context, h *History, cls clients, rng *rand.Rand) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	proc := h.NewProcess()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		i := rng.IntN(len(cls))
		op := Op{Process: proc, Node: -1, Kind: KTick, Call: h.Now()}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cls[i].Cluster(rctx)
		cancel()
		op.Return = h.Now()
		op.Status, op.Code, op.Err = classify(err)
		if err == nil {
			op.Value, op.PeriodMS = int64(st.Tick), st.TickPeriodMS
		}
		if op.Status != StatusOK {
			continue // a failed read tells nothing and has no effect
		}
		h.Add(op)
	}
}

// withoutDamage drops, from the log of a node whose data a nemesis damaged
// on purpose, what refusing that damage prints: the message of a log entry
// that does not decode or a snapshot whose CRC does not match, and the
// panic (with its goroutine dump) that stops the server on it. A data race
// or any other panic still shows.
func withoutDamage(log string) string {
	lines := strings.Split(log, "\n")
	out := lines[:0]
	dump := false
	for _, line := range lines {
		switch {
		case strings.Contains(line, "does not decode") || strings.Contains(line, "CRC mismatch") ||
			strings.Contains(line, "CRC checksum failed") || strings.Contains(line, "checksum mismatch"):
			dump = strings.HasPrefix(line, "panic:")
			continue
		case dump && !strings.Contains(line, "DATA RACE"):
			if line == "" || strings.HasPrefix(line, "time=") {
				dump = false
				out = append(out, line)
			}
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
