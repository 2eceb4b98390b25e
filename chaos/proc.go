//go:build linux

package chaos

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/leasehold/leasehold/chaos/lazyfs"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procNode is one `leasehold server` process, started with `ip netns exec`
// in its namespace, always with the same flags.
type procNode struct {
	c     *NetnsCluster
	i     int
	ns    string
	id    string
	addr  string
	log   string
	data  string
	clock string
	// mounted: data is a tmpfs of its own (NetnsOptions.DiskSize).
	mounted bool
	// lazy: data is a lazy filesystem (NetnsOptions.LazyDisk).
	lazy *lazyfs.FS
	// peer, once renumbered (Renumber) the renumbered-th time, is the IP
	// of its Raft and gossip ports; "" means addr. Guarded by mu.
	peer       string
	renumbered int
	// renamed, once the node came back under a new id (Reidentify), is
	// its --node-id; "" means id. Guarded by mu.
	renamed string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{} // closed when cmd has exited
	err    error         // cmd.Wait's result, once done is closed
	paused bool
}

// args are the server's flags: the same at every start, but for the
// Raft and gossip IP of a renumbered node. Called with mu held.
func (n *procNode) args() []string {
	c := n.c
	var join []string
	for j := range c.opts.Nodes {
		if j != n.i {
			join = append(join, c.nodeIP(j)+":"+strconv.Itoa(netnsGossipPort))
		}
	}
	peer := n.addr
	if n.peer != "" {
		peer = n.peer
	}
	a := []string{"server",
		"--node-id", cmp.Or(n.renamed, n.id),
		"--data-dir", n.data,
		"--http-addr", n.addr + ":" + strconv.Itoa(netnsHTTPPort),
		"--raft-addr", peer + ":" + strconv.Itoa(netnsRaftPort),
		"--gossip-addr", peer + ":" + strconv.Itoa(netnsGossipPort),
		"--bootstrap-expect", strconv.Itoa(c.opts.Nodes),
		// The namespaces' addresses are not loopback: plaintext must be
		// asked for. Only the harness's own namespaces reach them.
		"--insecure-plaintext",
	}
	if len(join) > 0 {
		a = append(a, "--join", strings.Join(join, ","))
	}
	return append(a, c.opts.ExtraFlags...)
}

// env is the harness's environment without LEASEHOLD_* (every server flag
// reads one), plus Options.Env and the clock file.
func (n *procNode) env() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "LEASEHOLD_") {
			env = append(env, e)
		}
	}
	env = append(env, n.c.opts.Env...)
	return append(env, "LEASEHOLD_CHAOS_CLOCK="+n.clock)
}

// start launches the server. It is an error if it is running.
func (n *procNode) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.runningLocked() {
		return fmt.Errorf("chaos: %s is running (pid %d)", n.id, n.cmd.Process.Pid)
	}
	f, err := os.OpenFile(n.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("chaos: %s log: %w", n.id, err)
	}
	fmt.Fprintf(f, "%s%s at %s ====\n", startHeader, n.id, time.Now().UTC().Format(time.RFC3339Nano))
	ip, err := lookPath("ip")
	if err != nil {
		f.Close()
		return err
	}
	cmd := exec.Command(ip, append([]string{"netns", "exec", n.ns, n.c.opts.Binary}, n.args()...)...)
	cmd.Env = n.env()
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = n.c.opts.Dir
	// `ip netns exec` execs the server in place, so the pid is the
	// server's. Pdeathsig: the server dies with the harness. The kernel
	// sends it when the *thread* that forked exits, and Go ends a thread
	// whose goroutine exits locked to it, so every start goes through the
	// cluster's spawner thread, which lives until Close.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.c.spawn(cmd); err != nil {
		f.Close()
		return fmt.Errorf("chaos: start %s: %w", n.id, err)
	}
	done := make(chan struct{})
	n.cmd, n.done, n.err, n.paused = cmd, done, nil, false
	go func() {
		err := cmd.Wait()
		f.Close()
		n.mu.Lock()
		n.err = err
		n.mu.Unlock()
		close(done)
	}()
	return nil
}

func (n *procNode) runningLocked() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *procNode) alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runningLocked()
}

// exited returns an error if the last start has exited (nil while it runs
// or before the first start).
func (n *procNode) exited() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.runningLocked() {
		return nil
	}
	if n.err != nil {
		return n.err
	}
	return errors.New("exited with status 0")
}

// signal sends sig to the server's process group.
func (n *procNode) signalLocked(sig syscall.Signal) error {
	pid := n.cmd.Process.Pid
	if pid <= 1 {
		return fmt.Errorf("chaos: refusing to signal pid %d", pid)
	}
	if err := syscall.Kill(-pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("chaos: %s: %v: %w", n.id, sig, err)
	}
	return nil
}

// kill sends SIGKILL and waits (at most 10 s) until the process is reaped.
func (n *procNode) kill() error {
	n.mu.Lock()
	if !n.runningLocked() {
		n.mu.Unlock()
		return nil
	}
	err := n.signalLocked(syscall.SIGKILL)
	done := n.done
	n.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("chaos: %s did not exit within 10s of SIGKILL", n.id)
	}
}

// pause sends SIGSTOP (stop) or SIGCONT, and reports whether the node was
// paused before.
func (n *procNode) pause(stop bool) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.runningLocked() {
		return false, fmt.Errorf("chaos: %s is not running", n.id)
	}
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	was := n.paused
	if err := n.signalLocked(sig); err != nil {
		return was, err
	}
	n.paused = stop
	return was, nil
}

// stop asks the server to shut down (SIGTERM, after SIGCONT if paused),
// then kills it if it has not exited within grace.
func (n *procNode) stop(grace time.Duration) {
	n.mu.Lock()
	if !n.runningLocked() {
		n.mu.Unlock()
		return
	}
	n.signalLocked(syscall.SIGCONT)
	n.signalLocked(syscall.SIGTERM)
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
		return
	case <-time.After(grace):
	}
	n.kill()
}

// spawner starts processes from one OS thread that stays locked to its
// goroutine until stopped, so that Pdeathsig fires only when the harness
// process (or Close) ends it.
type spawner struct {
	reqs chan spawnReq
	quit chan struct{}
	once sync.Once
}

type spawnReq struct {
	cmd  *exec.Cmd
	errc chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), quit: make(chan struct{})}
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		for {
			select {
			case r := <-s.reqs:
				r.errc <- r.cmd.Start()
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd: cmd, errc: make(chan error, 1)}
	select {
	case s.reqs <- r:
		return <-r.errc
	case <-s.quit:
		return errors.New("chaos: the cluster is closed")
	}
}

// stop ends the spawner's thread; call it only once every process it
// started has exited.
func (s *spawner) stop() { s.once.Do(func() { close(s.quit) }) }

var (
	toolMu    sync.Mutex
	toolPaths = map[string]string{}
)

// lookPath finds a system tool in PATH or, as root's PATH usually has them,
// in /usr/sbin and /sbin.
func lookPath(name string) (string, error) {
	toolMu.Lock()
	defer toolMu.Unlock()
	if p, ok := toolPaths[name]; ok {
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
			cand := dir + "/" + name
			if fi, serr := os.Stat(cand); serr == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				p, err = cand, nil
				break
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("chaos: %s not found: %w", name, err)
	}
	toolPaths[name] = p
	return p, nil
}

// run runs a system tool (args[0]) with stdin, bounded by 20 s, and returns
// an error carrying its output if it fails.
func run(ctx context.Context, stdin io.Reader, args ...string) error {
	_, err := output(ctx, stdin, args...)
	return err
}

// output is run returning the tool's standard output.
func output(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	p, err := lookPath(args[0])
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, p, args[1:]...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("chaos: %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
