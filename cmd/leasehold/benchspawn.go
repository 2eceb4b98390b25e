package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// spawnReadyTimeout bounds how long a spawned cluster has to elect a leader
// and report ready on every server.
const spawnReadyTimeout = time.Minute

// spawnedCluster is a throwaway cluster of this binary's servers on
// loopback, each with its data directory under one temporary directory.
type spawnedCluster struct {
	dir    string
	procs  []*exec.Cmd
	exited []chan struct{} // closed when the server's process has ended
	http   []string        // each server's HTTP address (host:port)
	leader string          // the leader's HTTP address once ready
	logs   []string        // each server's log file
}

// freeLoopbackPorts returns n distinct ports free on 127.0.0.1 for TCP and
// UDP (gossip binds both), holding each until all are chosen so that none
// is handed out twice. Another process may take one before a server binds
// it; that server then fails to start and the bench says so.
func freeLoopbackPorts(n int) ([]int, error) {
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 50*n {
			return nil, errors.New("no free loopback ports")
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		held = append(held, pc)
		ports = append(ports, port)
	}
	return ports, nil
}

// spawnCluster starts n servers of exe (empty: this binary) (a new cluster: one
// bootstraps alone, more form it with --bootstrap-expect) with extra server
// flags, and waits until every one is ready. stop ends them and removes
// their data.
func spawnCluster(ctx context.Context, n int, exe string, extra []string) (*spawnedCluster, error) {
	var err error
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("--spawn: find this binary: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "leasehold-bench-")
	if err != nil {
		return nil, fmt.Errorf("--spawn: %w", err)
	}
	sc := &spawnedCluster{dir: dir}
	free, err := freeLoopbackPorts(3 * n)
	if err != nil {
		sc.stop()
		return nil, fmt.Errorf("--spawn: %w", err)
	}
	type ports struct{ http, raft, gossip int }
	ps := make([]ports, n)
	var gossip []string
	for i := range ps {
		ps[i] = ports{free[3*i], free[3*i+1], free[3*i+2]}
		gossip = append(gossip, fmt.Sprintf("127.0.0.1:%d", ps[i].gossip))
	}
	for i, p := range ps {
		id := fmt.Sprintf("bench%d", i+1)
		args := []string{"server", "--node-id", id, "--data-dir", filepath.Join(dir, id),
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", p.http),
			"--raft-addr", fmt.Sprintf("127.0.0.1:%d", p.raft),
			"--gossip-addr", gossip[i], "--log-level", "warn"}
		if n > 1 {
			args = append(args, "--bootstrap-expect", strconv.Itoa(n), "--join", strings.Join(gossip, ","))
		}
		args = append(args, extra...)
		logPath := filepath.Join(dir, id+".log")
		logf, err := os.Create(logPath)
		if err != nil {
			sc.stop()
			return nil, fmt.Errorf("--spawn: %w", err)
		}
		cmd := exec.Command(exe, args...)
		cmd.Stdout, cmd.Stderr = logf, logf
		// The servers are the bench's own: no environment of the shell
		// (LEASEHOLD_* flags) leaks into them.
		cmd.Env = benchServerEnv()
		if err := cmd.Start(); err != nil {
			logf.Close()
			sc.stop()
			return nil, fmt.Errorf("--spawn: start server: %w", err)
		}
		logf.Close()
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }() //nolint:errcheck // the exit is reported by waitReady
		sc.procs, sc.exited = append(sc.procs, cmd), append(sc.exited, exited)
		sc.http = append(sc.http, fmt.Sprintf("127.0.0.1:%d", p.http))
		sc.logs = append(sc.logs, logPath)
	}
	if err := sc.waitReady(ctx); err != nil {
		sc.stop()
		return nil, err
	}
	return sc, nil
}

// benchServerEnv is the environment of spawned servers: the caller's,
// without LEASEHOLD_ variables (they would set server flags).
func benchServerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASEHOLD_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitReady polls every server's /readyz, then asks one for the leader.
func (sc *spawnedCluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, spawnReadyTimeout)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	get := func(addr, path string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
		if err != nil {
			return 0, nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, b, err
	}
	for {
		ready := 0
		for i, addr := range sc.http {
			select {
			case <-sc.exited[i]:
				return fmt.Errorf("--spawn: server %d exited: %s", i+1, logTail(sc.logs[i]))
			default:
			}
			if code, _, err := get(addr, "/readyz"); err == nil && code == http.StatusOK {
				ready++
			}
		}
		if ready == len(sc.http) {
			code, body, err := get(sc.http[0], "/v1/cluster")
			var st wire.ClusterStatus
			if err == nil && code == http.StatusOK && json.Unmarshal(body, &st) == nil {
				for _, m := range st.Members {
					if m.ID == st.Leader && m.HTTPAddr != "" {
						sc.leader = strings.TrimPrefix(strings.TrimPrefix(m.HTTPAddr, "http://"), "https://")
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("--spawn: %d servers not ready with a leader within %s; the first one's log ends: %s", len(sc.http), spawnReadyTimeout, logTail(sc.logs[0]))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop ends the servers (SIGTERM, then SIGKILL after 10 s) and removes
// their data directory.
func (sc *spawnedCluster) stop() {
	for _, p := range sc.procs {
		p.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited
	}
	for i, p := range sc.procs {
		select {
		case <-sc.exited[i]:
		case <-time.After(10 * time.Second):
			p.Process.Kill() //nolint:errcheck
			<-sc.exited[i]
		}
	}
	os.RemoveAll(sc.dir)
}

// parseSpawn reads --spawn: comma-separated cluster sizes, each 1-7.
func parseSpawn(v string) ([]int, error) {
	var sizes []int
	for _, f := range splitList(v) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 7 {
			return nil, usageErrorf("--spawn %q: want cluster sizes from 1 to 7, comma-separated (e.g. 1,3)", v)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// logTail returns the end of a spawned server's log (the directory holding
// it is removed when the bench ends).
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}
