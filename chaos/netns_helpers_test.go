//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Helpers of the netns tests: building the binary, reaching into
// namespaces, polling.

const netnsWait = 30 * time.Second // bound of every wait below

func needNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("GAP: the netns cluster tests need root (network namespaces, nftables); not run")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := lookPath(tool); err != nil {
			t.Skipf("GAP: the netns cluster tests need %s (apt-get install iproute2 nftables); not run", tool)
		}
	}
}

// needNetnsHarness is needNetns for the real-process harness's own tests
// (a cluster of server processes in namespaces, its faults, its clock, its
// cleanup when the harness dies): with the server builds they take a
// minute or more, so `make chaos-ci` runs them (LEASEHOLD_CHAOS_NETNS=1),
// beside the scenarios, not `make test`.
func needNetnsHarness(t *testing.T) {
	t.Helper()
	if os.Getenv("LEASEHOLD_CHAOS_NETNS") != "1" {
		t.Skip("run by `make chaos-ci` with LEASEHOLD_CHAOS_NETNS=1")
	}
	needNetns(t)
}

var (
	buildMu   sync.Mutex
	buildDir  string
	buildErrs = map[string]error{}
)

// leaseholdBinary builds cmd/leasehold once per test binary.
func leaseholdBinary(t *testing.T) string { return buildLeasehold(t, "") }

// buildLeasehold builds cmd/leasehold with the given build tags, once per
// test binary and set of tags.
func buildLeasehold(t *testing.T, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir == "" {
		d, err := os.MkdirTemp("", "leasehold-chaos-bin-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	path := filepath.Join(buildDir, "leasehold"+strings.ReplaceAll(tags, ",", "-"))
	err, done := buildErrs[tags]
	if !done {
		cmd := exec.Command("go", "build", "-tags", tags, "-o", path, "../cmd/leasehold")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err = cmd.Run(); err != nil {
			err = fmt.Errorf("go build -tags %q: %v\n%s", tags, err, out.String())
		}
		buildErrs[tags] = err
	}
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("LHC_TEST_CHILD_HARNESS"); dir != "" {
		childHarness(dir)
		return
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// testLogger writes the harness's log to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// inNamespace runs fn on a thread moved into network namespace ns. The
// thread stays locked and ends with the goroutine, so nothing else ever
// runs there; sockets fn creates stay in ns.
func inNamespace(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with us
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// dialFrom opens (and closes) a TCP connection from namespace ns ("" for
// the harness) to addr.
func dialFrom(ns, addr string, timeout time.Duration) error {
	dial := func() error {
		c, err := net.DialTimeout("tcp4", addr, timeout)
		if err == nil {
			c.Close()
		}
		return err
	}
	if ns == "" {
		return dial()
	}
	return inNamespace(ns, dial)
}

// wantReach fails unless ns reaches addr; wantCut unless it does not.
func wantReach(t *testing.T, ns, addr string) {
	t.Helper()
	if err := dialFrom(ns, addr, 3*time.Second); err != nil {
		t.Fatalf("%s -> %s: want reachable: %v", nsLabel(ns), addr, err)
	}
}

func wantCut(t *testing.T, ns, addr string) {
	t.Helper()
	if err := dialFrom(ns, addr, 700*time.Millisecond); err == nil {
		t.Fatalf("%s -> %s: want cut, connected", nsLabel(ns), addr)
	}
}

func nsLabel(ns string) string {
	if ns == "" {
		return "harness"
	}
	return ns
}

// udpDelivered sends count datagrams from namespace fromNS to a socket
// bound on toAddr in namespace toNS and returns how many arrived.
func udpDelivered(t *testing.T, fromNS, toNS, fromIP, toAddr string, count int) int {
	t.Helper()
	var rx net.PacketConn
	if err := inNamespace(toNS, func() (err error) {
		rx, err = net.ListenPacket("udp4", toAddr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	var tx net.Conn
	if err := inNamespace(fromNS, func() (err error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.ParseIP(fromIP)}}
		tx, err = d.Dial("udp4", toAddr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	for k := range count {
		// A datagram nft drops on output fails with EPERM: not sent.
		tx.Write([]byte(strconv.Itoa(k)))
	}
	got := map[string]bool{}
	buf := make([]byte, 64)
	for len(got) < count {
		rx.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := rx.ReadFrom(buf)
		if err != nil {
			break // a second without a datagram: the rest are lost
		}
		got[string(buf[:n])] = true
	}
	return len(got)
}

var testHTTP = &http.Client{Timeout: 3 * time.Second}

// httpDo sends a request to node i and returns the status and body.
func httpDo(c *NetnsCluster, i int, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+c.HTTPAddr(i)+path, rd)
	if err != nil {
		return 0, nil, err
	}
	resp, err := testHTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// eventually polls cond every 50 ms until it holds or netnsWait passes.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(netnsWait)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, netnsWait, why)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// leaderOf returns the index of the node every node in among names as leader
// and that reports itself leader.
func leaderOf(t *testing.T, c *NetnsCluster, among []int) int {
	t.Helper()
	leader := -1
	eventually(t, fmt.Sprintf("one leader among %v", among), func() (bool, string) {
		id := ""
		for _, i := range among {
			v, err := c.status(context.Background(), i)
			if err != nil {
				return false, err.Error()
			}
			if v.Leader == "" || id != "" && v.Leader != id {
				return false, fmt.Sprintf("%s sees leader %q", c.NodeID(i), v.Leader)
			}
			id = v.Leader
		}
		for _, i := range among {
			if c.NodeID(i) == id {
				v, err := c.status(context.Background(), i)
				if err != nil || v.State != "Leader" {
					return false, fmt.Sprintf("%s named leader, is %v %v", id, v, err)
				}
				leader = i
				return true, ""
			}
		}
		return false, fmt.Sprintf("leader %s not among %v", id, among)
	})
	return leader
}

func without(n int, out ...int) []int {
	var r []int
next:
	for i := range n {
		for _, o := range out {
			if i == o {
				continue next
			}
		}
		r = append(r, i)
	}
	return r
}

func raftAddr(c *NetnsCluster, i int) string { return c.nodeIP(i) + ":" + strconv.Itoa(netnsRaftPort) }

func waitFormed(t *testing.T, c *NetnsCluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), netnsWait)
	defer cancel()
	if err := c.WaitFormed(ctx); err != nil {
		t.Fatal(err)
	}
}

func heal(t *testing.T, c *NetnsCluster) {
	t.Helper()
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	waitFormed(t, c)
}
