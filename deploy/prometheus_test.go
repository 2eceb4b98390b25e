package deploy_test

// Monitoring kit tests: promtool checks and unit-tests the alert rules, and
// a real Prometheus server scrapes a three-server in-process cluster and
// must find, through its HTTP API, every series the alert rules and the
// Grafana dashboard query. They need Debian's prometheus package (promtool
// and prometheus on PATH; .ci/run installs it) and skip without it.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/chaos"
	lhcluster "github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/node"
)

const (
	rulesFile     = "prometheus/leasehold.rules.yml"
	rulesTestFile = "prometheus/leasehold.rules.test.yml"
	dashboardFile = "grafana/leasehold.json"
)

func needBinary(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s not installed (Debian package prometheus)", name)
	}
	return p
}

func TestPrometheusRules(t *testing.T) {
	promtool := needBinary(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", rulesTestFile},
		{"check", "config", "prometheus/prometheus.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// serverProcessOnly are the series that only the leasehold server command
// exports (its credential reloads; certificates only with TLS on), not an
// in-process cluster; cmd/leasehold's reload tests check them.
var serverProcessOnly = map[string]bool{
	"leasehold_certificate_expiry_seconds": true,
	"leasehold_reload_errors_total":        true,
}

// metricSelector matches a metric name with its optional label matchers.
var metricSelector = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})?`)

// selectorsIn returns the series selectors of our metrics (leasehold_*,
// go_*, process_*, up) in a PromQL expression, with the dashboard's $job
// variable set to the job the rules expect.
func selectorsIn(expr string) []string {
	expr = strings.ReplaceAll(expr, "$job", "leasehold")
	var out []string
	for _, m := range metricSelector.FindAllString(expr, -1) {
		name, _, _ := strings.Cut(m, "{")
		if strings.HasPrefix(name, "leasehold_") || strings.HasPrefix(name, "go_") ||
			strings.HasPrefix(name, "process_") || name == "up" {
			out = append(out, m)
		}
	}
	return out
}

// ruleExprs returns the expr fields of the rules file (single line, or a
// block scalar: the lines indented deeper than the expr key).
func ruleExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []string
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		v, ok := strings.CutPrefix(trimmed, "expr:")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "|" || v == ">" {
			indent := len(lines[i]) - len(trimmed)
			var block []string
			for i+1 < len(lines) {
				next := lines[i+1]
				if strings.TrimSpace(next) != "" && len(next)-len(strings.TrimLeft(next, " ")) <= indent {
					break
				}
				block = append(block, next)
				i++
			}
			v = strings.Join(block, "\n")
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		t.Fatal("no expr in the rules file")
	}
	return out
}

// dashboardExprs returns the expr of every panel target of the dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if tg.Expr != "" {
				out = append(out, tg.Expr)
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no panel queries in the dashboard")
	}
	return out
}

func TestSelectorsIn(t *testing.T) {
	got := selectorsIn(`histogram_quantile(0.99, sum by (job, le) (rate(leasehold_expiry_lateness_seconds_bucket{job="$job"}[10m]))) > on (job) (3 * max by (job) (leasehold_tick_period_seconds) + 0.25) or up{job="x"} == 0`)
	want := []string{`leasehold_expiry_lateness_seconds_bucket{job="leasehold"}`, "leasehold_tick_period_seconds", `up{job="x"}`}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("selectors %q, want %q", got, want)
	}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// promAPI gets a Prometheus HTTP API path and decodes its data field.
func promAPI(base, path string, q url.Values, data any) error {
	resp, err := http.Get(base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// TestPrometheusScrapesCluster: a real Prometheus scrapes a three-server
// cluster with the kit's rules loaded; every series the rules and the
// dashboard use exists, and every server is up. Server 0 keeps its Raft
// log in wal/, the others in raft.db, so that both log stores' series
// (leasehold_raft_wal_storeLogs, leasehold_raft_boltdb_storeLogs) show.
func TestPrometheusScrapesCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and a Prometheus server")
	}
	promBin := needBinary(t, "prometheus")
	needBinary(t, "promtool")
	rules, err := filepath.Abs(rulesFile)
	if err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	dir := t.TempDir()
	c, err := chaos.NewInprocCluster(ctx, chaos.InprocOptions{Dir: filepath.Join(dir, "cluster"), RaftTimeout: time.Second,
		Configure: func(i int, cfg *node.Config) {
			if i == 0 {
				cfg.RaftLog = lhcluster.LogStoreWAL
			} else {
				cfg.RaftLog = lhcluster.LogStoreBoltDB
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background(), false) })

	var targets []string
	for i := range c.Size() {
		targets = append(targets, strconv.Quote(c.HTTPAddr(i)))
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: leasehold
    scrape_timeout: 1s
    static_configs:
      - targets: [%s]
`, rules, strings.Join(targets, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freeLoopbackPort(t)
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(promBin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	showLog := func() string {
		b, _ := os.ReadFile(logf.Name())
		return string(b)
	}

	// Some traffic: an acquire through a follower (forwarded), a lease left
	// to expire, a release.
	for i := range c.Size() {
		body := fmt.Sprintf(`{"key":"k%d","holder":"h","ttl_ms":1000}`, i)
		resp, err := http.Post("http://"+c.HTTPAddr(i)+"/v1/leases", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("acquire on node %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("acquire on node %d: %s %s", i, resp.Status, b)
		}
	}

	selectors := map[string]bool{}
	for _, e := range append(ruleExprs(t), dashboardExprs(t)...) {
		for _, s := range selectorsIn(e) {
			if name, _, _ := strings.Cut(s, "{"); !serverProcessOnly[name] {
				selectors[s] = true
			}
		}
	}
	var missing []string
	deadline := time.Now().Add(120 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, showLog())
		default:
		}
		missing = missing[:0]
		for s := range selectors {
			var series []map[string]string
			if err := promAPI(base, "/api/v1/series", url.Values{"match[]": {s}}, &series); err != nil || len(series) == 0 {
				missing = append(missing, s)
			}
		}
		// Every server is scraped and up.
		var up struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		}
		upOK := promAPI(base, "/api/v1/query", url.Values{"query": {`up{job="leasehold"} == 1`}}, &up) == nil &&
			len(up.Result) == c.Size()
		if !upOK {
			missing = append(missing, "3 servers up")
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("series missing after 120s: %q\nprometheus log:\n%s", missing, showLog())
	}
	t.Logf("%d selectors of the rules and the dashboard found", len(selectors))

	// The traffic shows (at least: a leader change in between may make an
	// expiry observed by two leaders): two acquires went through followers, three leases
	// expired (measured by the leader), three were acquired (every server
	// counts the same events: max over servers). A forwarded request is
	// answered, and counted, on the follower and on the leader.
	for query, want := range map[string]float64{
		`sum(leasehold_forwarded_requests_total{job="leasehold",outcome="proxied"})`: 2,
		`sum(leasehold_expiry_lateness_seconds_count{job="leasehold",kind="lease"})`: 3,
		`max(leasehold_leases_acquired_total{job="leasehold"})`:                      3,
		`max(leasehold_leases_expired_total{job="leasehold"})`:                       3,
		`count(leasehold_build_info{job="leasehold",version!="",goversion=~"go.+"})`: 3,
		// Three on the leader, and the followers' two forwarded answers.
		`sum(leasehold_http_request_duration_seconds_count{route="/v1/leases",code="201"})`: 5,
	} {
		var got float64
		deadline := time.Now().Add(60 * time.Second)
		for {
			var res struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			}
			got = -1
			if err := promAPI(base, "/api/v1/query", url.Values{"query": {query}}, &res); err == nil && len(res.Result) == 1 && len(res.Result[0].Value) == 2 {
				if s, ok := res.Result[0].Value[1].(string); ok {
					got, _ = strconv.ParseFloat(s, 64)
				}
			} else if err == nil && len(res.Result) == 0 {
				got = 0
			}
			if got >= want || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if got < want {
			t.Errorf("%s = %v, want at least %v", query, got, want)
		}
	}

	// The rules loaded into the real server, and none of them is broken.
	var rg struct {
		Groups []struct {
			Rules []struct {
				Name      string `json:"name"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	pollRules := time.Now().Add(60 * time.Second)
	for {
		if err := promAPI(base, "/api/v1/rules", nil, &rg); err != nil {
			t.Fatal(err)
		}
		bad, n := "", 0
		for _, g := range rg.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health != "ok" {
					bad += fmt.Sprintf(" %s: %s %s;", r.Name, r.Health, r.LastError)
				}
			}
		}
		if n > 0 && bad == "" {
			break
		}
		if time.Now().After(pollRules) {
			t.Fatalf("rules: %d loaded, not ok:%s", n, bad)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
