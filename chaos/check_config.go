package chaos

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The configuration checker: what the servers expose of their Raft
// configuration and elections, judged for the two rules a membership change
// must keep.
//
//  1. One leader per term. Every server that leads a term won its election
//     in that term and logged it (hashicorp/raft's "election won", with the
//     term): the logs of every node, across restarts, hold every win, so
//     two wins of one term are two leaders in it.
//  2. One voter change at a time. The harness samples every node's own
//     configuration (GET /v1/cluster, its local view: the latest
//     configuration it holds, committed or not) several times a second.
//     When a node's voter set changes by more than one voter from its
//     previous sample, the node may only have skipped configurations it
//     never saw (it was down, cut off or paused, or it installed a
//     snapshot): the set it now holds must then be one a leader appended
//     (hashicorp/raft logs each configuration entry it appends, "updating
//     configuration" with the servers after the change; every entry in a
//     log was appended by some leader, one change from the configuration
//     before it). A voter set no leader appended that differs from its
//     predecessor by more than one voter came from outside the log (a
//     configuration rewritten by hand, a second bootstrap): a violation.
//     Each server also logs the configuration it starts with ("initial
//     configuration"): it must be within a voter of one the cluster had
//     before that start (the first sampled on a node, or one a leader
//     appended earlier: the leader logs the entry before it sends or
//     stores it, so it precedes any start that reads it back), as it comes
//     from the server's own log and snapshots. This catches a rewrite that
//     the log's next entries overwrite before a sample sees it, and one the
//     rewritten server makes look appended: started as the one voter of its
//     configuration it elects itself, and its reconciler's first change
//     (the other servers added back as non-voters) is an entry it appends
//     with that voter set, after its start. The times are the log lines'
//     (every node's log is stamped by the one host clock; the chaos clock
//     faults shift only what the servers report, not their log lines).

// configSample is one node's voter set as it answered at harness time at.
type configSample struct {
	node   int
	at     int64
	voters string // sorted voter ids, space-separated
}

// configWatch samples every live node's configuration.
type configWatch struct {
	mu      sync.Mutex
	samples []configSample // one per change of a node's voter set
	last    map[int]string
}

// watchConfig polls each live node's local view every `every` and keeps a
// sample whenever its voter set differs from its previous one.
func (e *Env) watchConfig(ctx context.Context, every time.Duration) *configWatch {
	w := &configWatch{last: map[int]string{}}
	var wg sync.WaitGroup
	for i := 0; i < e.C.Size(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if !e.C.Alive(i) {
					continue
				}
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				st, err := e.Admin(i).Cluster(cctx)
				cancel()
				if err != nil {
					continue
				}
				var ids []string
				for _, m := range st.Members {
					if m.Voter {
						ids = append(ids, m.ID)
					}
				}
				if len(ids) == 0 {
					continue // not in a configuration yet (a wiped server starting)
				}
				w.add(i, e.H.Now(), ids)
			}
		}()
	}
	go func() { <-ctx.Done(); wg.Wait() }()
	return w
}

func (w *configWatch) add(node int, at int64, ids []string) {
	sort.Strings(ids)
	set := strings.Join(ids, " ")
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last[node] == set {
		return
	}
	w.last[node] = set
	w.samples = append(w.samples, configSample{node: node, at: at, voters: set})
}

func (w *configWatch) all() []configSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]configSample(nil), w.samples...)
}

var (
	electionWonRe  = regexp.MustCompile(`msg="election won".* term=(\d+)`)
	updatingConfRe = regexp.MustCompile(`msg="updating configuration"`)
	initialConfRe  = regexp.MustCompile(`msg="initial configuration"`)
	lineTimeRe     = regexp.MustCompile(`^time=(\S+)`)
	confServerRe   = regexp.MustCompile(`\{Suffrage:(\w+) ID:([^ ]+) Address:`)
)

// voterDiff is the number of voters in one set and not the other.
func voterDiff(a, b string) int {
	in := map[string]int{}
	for _, id := range strings.Fields(a) {
		in[id]++
	}
	for _, id := range strings.Fields(b) {
		in[id]--
	}
	n := 0
	for _, v := range in {
		if v != 0 {
			n++
		}
	}
	return n
}

// CheckConfiguration judges the nodes' logs (file name to contents) and the
// sampled configurations: no two election wins in one term, and no node's
// voter set changing by more than one voter to a set no leader appended.
// Counts: elections, appended (configuration entries appended),
// voter-changes (distinct changes of a voter set seen on the nodes).
func CheckConfiguration(logs map[string]string, samples []configSample) Verdict {
	v := Verdict{Checker: "configuration", Valid: true, Counts: map[string]int{}}
	names := make([]string, 0, len(logs))
	for name := range logs {
		names = append(names, name)
	}
	sort.Strings(names)
	winners := map[uint64][]string{}
	appended := map[string]bool{}
	firstAppended := map[string]time.Time{} // the earliest line that appended a voter set
	type start struct {
		node, voters string
		at           time.Time
	}
	var starts []start
	for _, name := range names {
		for _, line := range strings.Split(logs[name], "\n") {
			if m := electionWonRe.FindStringSubmatch(line); m != nil {
				term, _ := strconv.ParseUint(m[1], 10, 64)
				winners[term] = append(winners[term], strings.TrimSuffix(name, ".log"))
				v.Counts["elections"]++
				continue
			}
			if updatingConfRe.MatchString(line) {
				set, at := lineVoters(line), lineTime(line)
				if t, ok := firstAppended[set]; !ok || at.Before(t) {
					firstAppended[set] = at
				}
				appended[set] = true
				v.Counts["appended"]++
			}
			if initialConfRe.MatchString(line) {
				if set := lineVoters(line); set != "" {
					starts = append(starts, start{strings.TrimSuffix(name, ".log"), set, lineTime(line)})
				}
			}
		}
	}
	terms := make([]uint64, 0, len(winners))
	for t := range winners {
		terms = append(terms, t)
	}
	slices.Sort(terms)
	for _, t := range terms {
		if len(winners[t]) > 1 {
			v.Counts["double-leaders"]++
			v.fail("term %d has %d leaders: election won by %s", t, len(winners[t]), strings.Join(winners[t], ", "))
		}
	}

	prev := map[int]string{}
	first := map[int]string{}
	changes := map[[2]string]bool{}
	for _, s := range samples {
		p, seen := prev[s.node]
		prev[s.node] = s.voters
		if !seen {
			continue
		}
		changes[[2]string{p, s.voters}] = true
		if d := voterDiff(p, s.voters); d > 1 && !appended[s.voters] {
			v.Counts["multi-voter-changes"]++
			v.fail("node %d's voters went from [%s] to [%s] at %s: %d voters at once, to a configuration no leader appended",
				s.node, p, s.voters, fmtT(s.at), d)
		}
	}
	// What a server starts with comes from its own log and snapshots:
	// a configuration the cluster had before it started (the first one
	// sampled on a node, or one a leader appended earlier), give or take
	// a voter. A line without a readable time counts as earlier.
	sampled := map[string]bool{}
	for _, s := range samples {
		if _, ok := first[s.node]; !ok {
			first[s.node] = s.voters
			sampled[s.voters] = true
		}
	}
	for _, st := range starts {
		near, later := false, false
		for k := range sampled {
			near = near || voterDiff(k, st.voters) <= 1
		}
		for k, at := range firstAppended {
			if voterDiff(k, st.voters) > 1 {
				continue
			}
			if at.IsZero() || st.at.IsZero() || !at.After(st.at) {
				near = true
			} else {
				later = true
			}
		}
		if !near {
			v.Counts["multi-voter-changes"]++
			why := "more than one voter away from every configuration the cluster had"
			if later {
				why += " before it started (a leader appended a configuration near it only afterwards)"
			}
			v.fail("%s started with voters [%s] at %s: %s", st.node, st.voters, st.at.UTC().Format("15:04:05.000"), why)
		}
	}
	v.Counts["starts"] = len(starts)
	v.Counts["voter-changes"] = len(changes)
	v.Counts["samples"] = len(samples)
	if v.Counts["elections"] == 0 {
		v.fail("no election won in any node's log: the logs cannot be read, the check proves nothing")
	}
	if v.Valid {
		v.Detail = fmt.Sprintf("%d elections, one leader per term; %d configurations appended, %d voter-set changes seen, one voter at a time",
			v.Counts["elections"], v.Counts["appended"], v.Counts["voter-changes"])
	}
	return v
}

// checkConfig runs CheckConfiguration on the run's node logs and w's
// samples, and counts the voter-set changes seen ("voter-changes") for the
// scenario's effectiveness.
func (e *Env) checkConfig(w *configWatch) Verdict {
	v := CheckConfiguration(readLogs(e.C), w.all())
	e.Count("voter-changes", v.Counts["voter-changes"])
	return v
}

// lineTime is the time a log line was written (its time= field), zero if
// it has none that parses.
func lineTime(line string) time.Time {
	m := lineTimeRe.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil {
		return time.Time{}
	}
	return t
}

// lineVoters is the sorted voter ids of a configuration hashicorp/raft
// logged (servers=[{Suffrage:Voter ID:... Address:...} ...]).
func lineVoters(line string) string {
	var ids []string
	for _, s := range confServerRe.FindAllStringSubmatch(line, -1) {
		if s[1] == "Voter" {
			ids = append(ids, s[2])
		}
	}
	sort.Strings(ids)
	return strings.Join(ids, " ")
}
