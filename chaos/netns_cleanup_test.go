//go:build linux

package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// assertRunGone fails if anything named after prefix is left: namespaces,
// root links, the state file.
func assertRunGone(t *testing.T, prefix string) {
	t.Helper()
	nss, err := runNamespaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(nss[prefix]) > 0 {
		t.Fatalf("namespaces left: %v", nss[prefix])
	}
	links, err := runLinks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := links[prefix]; ok {
		t.Fatalf("link left: %s", l)
	}
	out, err := output(context.Background(), nil, "ip", "-o", "link", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, prefix) {
		t.Fatalf("links named %s left:\n%s", prefix, out)
	}
	if _, err := os.Stat(filepath.Join(netnsStateDir, prefix+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left: %v", err)
	}
}

// procState is the state letter of /proc/pid/stat.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err.Error()
	}
	s := string(b)
	if k := strings.LastIndexByte(s, ')'); k >= 0 {
		if f := strings.Fields(s[k+1:]); len(f) > 0 {
			return f[0]
		}
	}
	return "?"
}

// TestNetnsCleanup fakes the leftovers of two dead runs, one with a state
// file whose owner is gone and one without any, each with a process inside
// its namespace, and checks that Cleanup removes all of it.
func TestNetnsCleanup(t *testing.T) {
	needNetns(t)
	ctx := context.Background()
	dead := netnsPrefix + "x" + randomRunID()[:5]
	orphan := netnsPrefix + "y" + randomRunID()[:5]

	var procs []*exec.Cmd
	t.Cleanup(func() {
		for _, p := range procs {
			p.Process.Kill()
		}
		for _, p := range []string{dead, orphan} {
			removeRun(ctx, p, 0)
			os.Remove(filepath.Join(netnsStateDir, p+".json"))
		}
	})

	// A dead owner: a process that has exited.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(netnsStateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	st, _ := json.Marshal(runState{Prefix: dead, Subnet: 251, OwnerPID: gone.Process.Pid, OwnerStart: "1"})
	if err := os.WriteFile(filepath.Join(netnsStateDir, dead+".json"), st, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dead, orphan} {
		for _, args := range [][]string{
			{"ip", "netns", "add", p + "n0"},
			{"ip", "netns", "add", p + "hub"},
			{"ip", "link", "add", p + "h", "type", "veth", "peer", "name", "h0", "netns", p + "hub"},
		} {
			if err := run(ctx, nil, args...); err != nil {
				t.Fatal(err)
			}
		}
		if err := run(ctx, strings.NewReader("table inet "+p+" {\n}\n"), "ip", "netns", "exec", p+"n0", "nft", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		ip, _ := lookPath("ip")
		cmd := exec.Command(ip, "netns", "exec", p+"n0", "cat")
		if _, err := cmd.StdinPipe(); err != nil { // held open: cat runs until killed
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	eventually(t, "processes inside the namespaces", func() (bool, string) {
		for _, p := range []string{dead, orphan} {
			out, err := output(ctx, nil, "ip", "netns", "pids", p+"n0")
			if err != nil || strings.TrimSpace(out) == "" {
				return false, fmt.Sprintf("%s: %q %v", p, out, err)
			}
		}
		return true, ""
	})

	if err := Cleanup(ctx, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dead, orphan} {
		assertRunGone(t, p)
	}
	for _, p := range procs {
		done := make(chan error, 1)
		go func() { done <- p.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("process in a leftover namespace exited cleanly; want killed")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("process in a leftover namespace still running after Cleanup")
		}
	}
}

// childHarness is TestNetnsHarnessDies's child: it starts a one-node
// cluster, prints its run prefix and the node's pid, and waits to be killed.
func childHarness(dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := NewNetnsCluster(ctx, NetnsOptions{Nodes: 1, Binary: os.Getenv("LHC_TEST_BINARY"), Dir: dir})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	c.nodes[0].mu.Lock()
	pid := c.nodes[0].cmd.Process.Pid
	c.nodes[0].mu.Unlock()
	fmt.Printf("up %s %d\n", c.prefix, pid)
	io.Copy(io.Discard, os.Stdin) // until the parent kills us
	os.Exit(2)
}

// TestNetnsHarnessDies kills a harness process (SIGKILL, no Close) and
// checks that its node dies with it (Pdeathsig) and that the next Cleanup
// removes the run's namespaces, link and state file.
func TestNetnsHarnessDies(t *testing.T) {
	needNetnsHarness(t)
	bin := leaseholdBinary(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "LHC_TEST_CHILD_HARNESS="+dir, "LHC_TEST_BINARY="+bin)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 1)
	go func() {
		b := make([]byte, 0, 256)
		buf := make([]byte, 256)
		for {
			n, err := stdout.Read(buf)
			b = append(b, buf[:n]...)
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				lines <- string(b[:i])
				return
			}
			if err != nil {
				lines <- string(b)
				return
			}
		}
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(90 * time.Second):
		t.Fatal("child harness did not start its cluster within 90s")
	}
	var prefix string
	var pid int
	if _, err := fmt.Sscanf(line, "up %s %d", &prefix, &pid); err != nil {
		t.Fatalf("child harness: %q", line)
	}
	t.Cleanup(func() {
		syscall.Kill(pid, syscall.SIGKILL)
		removeRun(context.Background(), prefix, 0)
		os.Remove(filepath.Join(netnsStateDir, prefix+".json"))
	})
	if st := procState(pid); st != "S" && st != "R" {
		t.Fatalf("node pid %d state %s", pid, st)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	eventually(t, "the node dies with its harness", func() (bool, string) {
		st := procState(pid)
		// Gone, or a zombie until init reaps it.
		return strings.Contains(st, "no such file") || st == "Z", st
	})
	nss, err := runNamespaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(nss[prefix]) == 0 {
		t.Fatal("the killed harness's namespaces are already gone: nothing for Cleanup to prove")
	}
	if err := Cleanup(context.Background(), testLogger(t)); err != nil {
		t.Fatal(err)
	}
	assertRunGone(t, prefix)
}
