package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMemLimitRealCgroup: a process in a real memory cgroup capped at
// 256 MiB reads that cap, and the soft memory limit relaxGC sets stays at
// or below 90% of it. The test creates a child cgroup (cgroup v1: under
// this process's memory cgroup; cgroup v2: under the hierarchy's root,
// whose cgroup.subtree_control must enable memory), moves a helper (this
// test binary, see TestMain) into it, and removes the cgroup after. It
// skips where cgroups cannot be written (not root, read-only mount).
func TestMemLimitRealCgroup(t *testing.T) {
	const capBytes = 256 << 20
	cg, ok, err := findMemCgroup("")
	if err != nil {
		t.Fatalf("finding the memory cgroup: %v", err)
	}
	if !ok {
		t.Skip("no memory cgroup hierarchy is mounted (not Linux, or no cgroup v1 memory / cgroup2 mount)")
	}
	parent, limitFile := cg.dir, "memory.limit_in_bytes"
	if cg.v2 {
		parent, limitFile = cg.mount, "memory.max"
		ctl, err := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if err != nil || !slices.Contains(strings.Fields(string(ctl)), "memory") {
			t.Skipf("cgroup v2 at %s does not enable the memory controller for its children (cgroup.subtree_control %q, %v)", parent, ctl, err)
		}
	}
	child := filepath.Join(parent, fmt.Sprintf("leasehold-test-%d", os.Getpid()))
	if err := os.Mkdir(child, 0o755); err != nil {
		if notWritable(err) {
			t.Skipf("cannot create a cgroup under %s: %v", parent, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroup(t, child) })
	if err := os.WriteFile(filepath.Join(child, limitFile), []byte(strconv.Itoa(capBytes)), 0o644); err != nil {
		if notWritable(err) {
			t.Skipf("cannot set %s in %s: %v", limitFile, child, err)
		}
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMEMLIMIT=") && !strings.HasPrefix(kv, "GOGC=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, helperEnv+"=memlimit")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if notWritable(err) {
			t.Skipf("cannot move a process into %s: %v", child, err)
		}
		t.Fatal(err)
	}
	_, _ = stdin.Write([]byte("go\n"))
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out.String())
	}
	var got, soft int64
	var errText string
	if _, err := fmt.Sscanf(out.String(), "cgroup=%d err=%s soft=%d", &got, &errText, &soft); err != nil {
		t.Fatalf("helper output %q: %v", out.String(), err)
	}
	if got != capBytes || errText != "<nil>" {
		t.Errorf("the helper read a cgroup limit of %d (err %s), want %d", got, errText, capBytes)
	}
	if soft > capBytes*9/10 {
		t.Errorf("soft memory limit %d MiB in a cgroup capped at %d MiB: above 90%% of the cap", soft>>20, capBytes>>20)
	}
}

func notWritable(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES)
}

// removeCgroup removes an empty cgroup, retrying while the kernel still
// counts the helper that just exited in it.
func removeCgroup(t *testing.T, dir string) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("removing cgroup %s: %v", dir, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
