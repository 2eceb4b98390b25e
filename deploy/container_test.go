package deploy_test

// Container test: the image of deploy/Dockerfile, three nodes on a Docker
// bridge network with the multi-node flags (the way docker-compose.yml runs
// them), then SIGKILL of the leader. A lease must survive the failover with
// its fencing token and its countdown, and writes must work again through the
// survivors.
//
// It needs a usable Docker engine (CI has one and runs it as root); without
// one it skips, and in -short mode it skips.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// Every container, network and image tag of this test starts with this.
	prefix = "leasehold-ctest"
	// Leftovers of runs older than this (a test killed before its cleanup)
	// are removed at the start; younger ones may belong to a concurrent run.
	leftoverAge = 10 * time.Minute
	// Bound of every wait for the cluster.
	waitTimeout = 60 * time.Second
	ttlMS       = 30000
	tickPeriod  = 100 * time.Millisecond
)

var nodeIDs = []string{"n1", "n2", "n3"}

// Contract JSON (shared/CONTRACT.md; /v1/cluster as in node.ClusterStatus).
type lease struct {
	LeaseID      string `json:"lease_id"`
	Key          string `json:"key"`
	Holder       string `json:"holder"`
	State        string `json:"state"`
	FencingToken uint64 `json:"fencing_token"`
	TTLMS        int64  `json:"ttl_ms"`
	RemainingMS  int64  `json:"remaining_ms"`
	Token        string `json:"token"`
}

type member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
	Health   string `json:"health"`
}

type clusterStatus struct {
	NodeID  string   `json:"node_id"`
	Leader  string   `json:"leader"`
	State   string   `json:"state"`
	Term    uint64   `json:"term"`
	Members []member `json:"members"`
}

type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// docker runs the docker CLI and returns its trimmed stdout.
func docker(ctx context.Context, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

func mustDocker(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := docker(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// requireDocker skips unless the docker CLI can talk to an engine.
func requireDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("container test skipped in -short mode")
	}
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("docker is not usable (no docker CLI in PATH); this test needs the Docker engine, which CI provides")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := docker(ctx, "info", "--format", "{{.ServerVersion}}"); err != nil {
		t.Skipf("docker is not usable (%v); this test needs the Docker engine, which CI provides", err)
	}
}

// runID is unique per run and starts with the run's Unix time, which is how
// removeLeftovers tells old runs from concurrent ones.
func runID(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d-%s", time.Now().Unix(), hex.EncodeToString(b))
}

// leftoverOld reports whether name (PREFIX-UNIX-RAND...) belongs to a run
// older than leftoverAge.
func leftoverOld(name string) bool {
	rest, ok := strings.CutPrefix(strings.TrimPrefix(name, "/"), prefix+"-")
	if !ok {
		rest, ok = strings.CutPrefix(name, prefix+":") // image tag
	}
	if !ok {
		return false
	}
	ts, _, _ := strings.Cut(rest, "-")
	sec, err := strconv.ParseInt(ts, 10, 64)
	return err == nil && time.Since(time.Unix(sec, 0)) > leftoverAge
}

// removeLeftovers removes containers, networks and images of earlier runs
// that did not clean up (killed by a timeout, for instance).
func removeLeftovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	list := func(args ...string) []string {
		out, err := docker(ctx, args...)
		if err != nil {
			t.Logf("listing leftovers: %v", err)
			return nil
		}
		var old []string
		for _, name := range strings.Fields(out) {
			if leftoverOld(name) {
				old = append(old, name)
			}
		}
		return old
	}
	if old := list("ps", "-a", "--filter", "name="+prefix+"-", "--format", "{{.Names}}"); len(old) > 0 {
		t.Logf("removing leftover containers %v", old)
		docker(ctx, append([]string{"rm", "-f", "-v"}, old...)...)
	}
	if old := list("network", "ls", "--filter", "name="+prefix+"-", "--format", "{{.Name}}"); len(old) > 0 {
		t.Logf("removing leftover networks %v", old)
		docker(ctx, append([]string{"network", "rm"}, old...)...)
	}
	if old := list("image", "ls", prefix, "--format", "{{.Repository}}:{{.Tag}}"); len(old) > 0 {
		t.Logf("removing leftover images %v", old)
		docker(ctx, append([]string{"image", "rm", "-f"}, old...)...)
	}
}

// buildImage builds the static binary and the image of deploy/Dockerfile
// from a private build context, tagged tag.
func buildImage(t *testing.T, tag string) {
	t.Helper()
	ctxDir := t.TempDir()
	if err := os.Mkdir(filepath.Join(ctxDir, ".empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	dockerfile, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), dockerfile, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", filepath.Join(ctxDir, "leasehold"),
		"github.com/leasehold/leasehold/cmd/leasehold")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := docker(ctx, "image", "rm", "-f", tag); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	mustDocker(t, 3*time.Minute, "build", "-q", "-t", tag, ctxDir)
}

// cluster is the running test cluster.
type cluster struct {
	t      *testing.T
	run    string
	names  map[string]string // node id -> container name
	urls   map[string]string // node id -> HTTP base URL on the host
	client *http.Client
}

func startCluster(t *testing.T, image, run string) *cluster {
	t.Helper()
	c := &cluster{t: t, run: run, names: map[string]string{}, urls: map[string]string{},
		client: &http.Client{Timeout: 5 * time.Second}}
	network := prefix + "-" + run
	mustDocker(t, 60*time.Second, "network", "create", "--driver", "bridge", network)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := docker(ctx, "network", "rm", network); err != nil {
			t.Logf("cleanup: %v", err)
		}
	})
	var join []string
	for _, id := range nodeIDs {
		join = append(join, id+":7702")
	}
	for _, id := range nodeIDs {
		name := prefix + "-" + run + "-" + id
		c.names[id] = name
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := docker(ctx, "rm", "-f", "-v", name); err != nil {
				t.Logf("cleanup: %v", err)
			}
		})
		mustDocker(t, 60*time.Second, "run", "-d", "--name", name,
			"--network", network, "--network-alias", id, "--hostname", id,
			"-p", "127.0.0.1::7700",
			image,
			"--node-id", id, "--data-dir", "/data",
			"--http-addr", "0.0.0.0:7700", "--raft-addr", "0.0.0.0:7701", "--gossip-addr", "0.0.0.0:7702",
			"--advertise-addr", id, "--join", strings.Join(join, ","), "--bootstrap-expect", "3",
			"--tick-period", tickPeriod.String(), "--log-level", "debug",
			// Binding 0.0.0.0 needs TLS or this opt-out. Plaintext, as in
			// docker-compose.yml: Raft and gossip stay on the test's own
			// bridge network, HTTP is published on the host's loopback.
			"--insecure-plaintext")
		port := mustDocker(t, 30*time.Second, "port", name, "7700/tcp")
		// "127.0.0.1:49153", possibly one line per address family.
		port, _, _ = strings.Cut(port, "\n")
		c.urls[id] = "http://" + strings.TrimSpace(port)
	}
	// Registered last, so it runs first: logs while the containers exist.
	t.Cleanup(c.dumpLogsIfFailed)
	return c
}

func (c *cluster) dumpLogsIfFailed() {
	if !c.t.Failed() {
		return
	}
	for _, id := range nodeIDs {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, "docker", "logs", "--tail", "400", c.names[id]).CombinedOutput()
		cancel()
		c.t.Logf("=== docker logs %s (last 400 lines; err %v) ===\n%s", c.names[id], err, out)
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		state, _ := docker(ctx, "inspect", "--format", "{{.State.Status}} exit={{.State.ExitCode}} oom={{.State.OOMKilled}}", c.names[id])
		cancel()
		c.t.Logf("=== %s: %s ===", c.names[id], state)
	}
}

// do sends one request and decodes a 2xx answer into out; any other status
// is returned as an error carrying the contract's error code.
func (c *cluster) do(method, url string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		var e apiError
		json.Unmarshal(data, &e)
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s: %s", method, url, resp.StatusCode, e.Error.Code, strings.TrimSpace(string(data)))
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: decode %q: %v", method, url, data, err)
		}
	}
	return resp.StatusCode, nil
}

// status is node id's own view (stale: a follower would otherwise forward
// the read to the leader and answer the leader's view).
func (c *cluster) status(id string) (clusterStatus, error) {
	var st clusterStatus
	_, err := c.do("GET", c.urls[id]+"/v1/cluster?stale=true", nil, &st)
	return st, err
}

// eventually polls cond every 100 ms until it returns nil or timeout passes,
// then fails with cond's last error.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		<-time.After(100 * time.Millisecond)
	}
}

// waitLeader waits until every node of ids reports the same leader, one of
// ids, with at least minVoters voters in the configuration, and returns it.
func (c *cluster) waitLeader(ids []string, minVoters int, what string) string {
	c.t.Helper()
	var leader string
	eventually(c.t, waitTimeout, what, func() error {
		leader = ""
		for _, id := range ids {
			st, err := c.status(id)
			if err != nil {
				return err
			}
			if st.Leader == "" {
				return fmt.Errorf("%s knows no leader (state %s)", id, st.State)
			}
			if leader != "" && st.Leader != leader {
				return fmt.Errorf("nodes disagree on the leader: %s and %s", leader, st.Leader)
			}
			leader = st.Leader
			voters := 0
			for _, m := range st.Members {
				if m.Voter {
					voters++
				}
			}
			if voters < minVoters {
				return fmt.Errorf("%s lists %d voters, want at least %d: %+v", id, voters, minVoters, st.Members)
			}
		}
		for _, id := range ids {
			if id == leader {
				return nil
			}
		}
		return fmt.Errorf("leader %q is not one of %v", leader, ids)
	})
	return leader
}

func TestContainerClusterFailover(t *testing.T) {
	requireDocker(t)
	start := time.Now()
	removeLeftovers(t)
	run := runID(t)
	image := prefix + ":" + run
	buildImage(t, image)
	t.Logf("image %s built in %v", image, time.Since(start).Round(time.Millisecond))

	c := startCluster(t, image, run)
	leader := c.waitLeader(nodeIDs, 3, "three nodes agree on a leader")
	t.Logf("leader %s after %v", leader, time.Since(start).Round(time.Millisecond))

	// A lease through the leader, then let its countdown visibly run.
	var l lease
	sent := time.Now()
	eventually(t, waitTimeout, "acquire", func() error {
		_, err := c.do("POST", c.urls[leader]+"/v1/leases", map[string]any{
			"key": "camera/7", "holder": "runner-a", "ttl_ms": ttlMS, "idempotency_key": "ctest-" + run}, &l)
		return err
	})
	if l.State != "active" || l.FencingToken == 0 || l.LeaseID == "" || l.Token == "" {
		t.Fatalf("acquire answered %+v", l)
	}
	var before lease
	eventually(t, waitTimeout, "lease countdown runs on the leader", func() error {
		if _, err := c.do("GET", c.urls[leader]+"/v1/leases/"+l.LeaseID, nil, &before); err != nil {
			return err
		}
		if before.RemainingMS > ttlMS-1000 {
			return fmt.Errorf("remaining_ms %d", before.RemainingMS)
		}
		return nil
	})

	// SIGKILL the leader's container.
	mustDocker(t, 60*time.Second, "kill", "--signal", "KILL", c.names[leader])
	killed := time.Now()
	var survivors []string
	for _, id := range nodeIDs {
		if id != leader {
			survivors = append(survivors, id)
		}
	}
	// Whether the dead server is still a voter is up to the membership
	// policy; two voters are a quorum either way.
	newLeader := c.waitLeader(survivors, 2, "a new leader among the survivors")
	t.Logf("new leader %s %v after the kill", newLeader, time.Since(killed).Round(time.Millisecond))
	follower := survivors[0]
	if follower == newLeader {
		follower = survivors[1]
	}

	// The lease is still there, same id and fencing token, countdown neither
	// reset nor shortened.
	var after lease
	eventually(t, waitTimeout, "read the lease on the new leader", func() error {
		_, err := c.do("GET", c.urls[newLeader]+"/v1/leases/"+l.LeaseID, nil, &after)
		return err
	})
	elapsed := time.Since(sent)
	if after.LeaseID != l.LeaseID || after.Key != "camera/7" || after.Holder != "runner-a" {
		t.Errorf("lease after failover %+v, want id %s key camera/7 holder runner-a", after, l.LeaseID)
	}
	if after.State != "active" {
		t.Errorf("lease state after failover %q, want active", after.State)
	}
	if after.FencingToken != l.FencingToken {
		t.Errorf("fencing_token after failover %d, want %d", after.FencingToken, l.FencingToken)
	}
	if after.RemainingMS > before.RemainingMS {
		t.Errorf("remaining_ms went up across the failover: %d before the kill, %d after (TTL reset?)",
			before.RemainingMS, after.RemainingMS)
	}
	// Ticks never run faster than real time: at most one tick beyond the
	// elapsed time, plus one for rounding.
	if floor := ttlMS - elapsed.Milliseconds() - 2*tickPeriod.Milliseconds(); after.RemainingMS < floor {
		t.Errorf("remaining_ms %d after failover, %v after the acquire was sent: shortened (floor %d)",
			after.RemainingMS, elapsed.Round(time.Millisecond), floor)
	}
	t.Logf("lease %s: remaining_ms %d before the kill, %d after the failover (%v after the acquire)",
		l.LeaseID, before.RemainingMS, after.RemainingMS, elapsed.Round(time.Millisecond))

	// Still exclusive, and new writes work through a survivor that is not
	// the leader (it forwards to the leader).
	var (
		held lease
		code int
		err  error
	)
	eventually(t, waitTimeout, "an answer other than 5xx to acquiring the held key", func() error {
		code, err = c.do("POST", c.urls[newLeader]+"/v1/leases", map[string]any{
			"key": "camera/7", "holder": "runner-b", "ttl_ms": ttlMS}, &held)
		if code == 0 || code >= 500 {
			return err
		}
		return nil
	})
	if code != http.StatusConflict || !strings.Contains(fmt.Sprint(err), "LEASE_HELD") {
		t.Errorf("acquiring the held key after failover: status %d, err %v, lease %+v; want 409 LEASE_HELD", code, err, held)
	}
	var l2 lease
	eventually(t, waitTimeout, "acquire another key through the surviving follower "+follower, func() error {
		_, err := c.do("POST", c.urls[follower]+"/v1/leases", map[string]any{
			"key": "camera/8", "holder": "runner-b", "ttl_ms": ttlMS, "idempotency_key": "ctest2-" + run}, &l2)
		return err
	})
	if l2.State != "active" || l2.Key != "camera/8" || l2.FencingToken <= l.FencingToken {
		t.Errorf("acquire after failover answered %+v (first lease's fencing token %d)", l2, l.FencingToken)
	}
	t.Logf("done in %v", time.Since(start).Round(time.Millisecond))
}
