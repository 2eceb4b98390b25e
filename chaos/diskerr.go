package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// diskErrorer is a Cluster whose nodes' data directories can fail writes
// and fsyncs (NetnsCluster with NetnsOptions.LazyDisk).
type diskErrorer interface {
	DiskError(i int, errno string) error
	DiskErrorsHit(i int) int64
	ExitStatus(i int) int
}

// storageFailureStatus is the server's exit status when its Raft log
// cannot be written and a restart is what recovers it (cmd/leasehold).
const storageFailureStatus = 74

// diskErrorRound makes node n's disk fail every write and fsync with errno
// for d, then clears it. The node must report the fault while it lasts
// (/healthz 503 naming the Raft log, or an exit with the storage-failure
// status and its message) and come back healthy within 30 s of the clear:
// by itself, or, once it exited as documented, restarted by the harness as
// a supervisor would. The filesystem's count of failed calls proves the
// server hit the errors. Counts: disk-errors-injected (calls failed),
// disk-error-reported, storage-failure-exits, disk-error-recovered.
func (e *Env) diskErrorRound(ctx context.Context, n int, errno string, d time.Duration) error {
	de, ok := e.C.(diskErrorer)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot fail a node's disk writes: %w", e.Tier, ErrUnsupported)
	}
	hit0 := de.DiskErrorsHit(n)
	var (
		mu       sync.Mutex
		reported string
	)
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		// Watch /healthz while the fault lasts (and a little after).
		defer wg.Done()
		for pctx.Err() == nil {
			if code, body := healthz(pctx, e.C, n); code == http.StatusServiceUnavailable && strings.Contains(body, "Raft log cannot be written") {
				mu.Lock()
				if reported == "" {
					reported = "/healthz 503: " + truncate(body, 200)
				}
				mu.Unlock()
			}
			_ = sleepCtx(pctx, 250*time.Millisecond)
		}
	}()
	err := e.Fault(ctx, "disk-error", fmt.Sprintf("node %d: every write and fsync fails with %s", n, errno), d,
		func() error { return de.DiskError(n, errno) }, func() error { return de.DiskError(n, "") })
	if err != nil {
		stop()
		wg.Wait()
		return err
	}
	hit := de.DiskErrorsHit(n) - hit0
	e.Count("disk-errors-injected", int(hit))
	// Back to healthy within 30 s: by itself, or restarted after the
	// storage-failure exit.
	deadline := time.Now().Add(30 * time.Second)
	last := ""
	for {
		if !e.C.Alive(n) {
			status := de.ExitStatus(n)
			e.Note("disk-error", fmt.Sprintf("node %d exited with status %d; restarting it as a supervisor would", n, status), nil)
			if status == storageFailureStatus {
				e.Count("storage-failure-exits", 1)
				mu.Lock()
				if reported == "" {
					reported = fmt.Sprintf("exit status %d", status)
				}
				mu.Unlock()
			}
			if err := e.C.Restart(n); err != nil {
				stop()
				wg.Wait()
				return err
			}
			e.Count("restarts", 1)
		}
		code, body := healthz(ctx, e.C, n)
		if code == http.StatusOK && ready(ctx, e.C, n) {
			break
		}
		last = fmt.Sprintf("/healthz %d %s", code, truncate(body, 200))
		if time.Now().After(deadline) {
			stop()
			wg.Wait()
			return fmt.Errorf("disk-error: node %d not healthy and ready within 30 s of its disk working again (last: %s)", n, last)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			stop()
			wg.Wait()
			return err
		}
	}
	stop()
	wg.Wait()
	e.Count("disk-error-recovered", 1)
	if reported != "" {
		e.Count("disk-error-reported", 1)
	}
	e.Note("disk-error", fmt.Sprintf("node %d: %d calls failed with %s; reported: %q; healthy again", n, hit, errno, reported), nil)
	return nil
}

// healthz returns node i's /healthz status and body (0 without an answer).
func healthz(ctx context.Context, c Cluster, i int) (int, string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.HTTPAddr(i)+"/healthz", nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// diskErrors is the disk-error scenarios' nemesis: the leader's disk
// fails with EIO (room left: it steps down, and exits for a restart if its
// log still fails 3 s later), then the next leader's with ENOSPC (the disk
// reads as full: it steps down and waits, and goes on once there is room),
// then a follower's with EIO.
func (e *Env) diskErrors(ctx context.Context) error {
	for _, r := range []struct {
		leader bool
		errno  string
		d      time.Duration
	}{{true, "EIO", 5 * time.Second}, {true, "ENOSPC", 5 * time.Second}, {false, "EIO", 4 * time.Second}} {
		l, err := e.WaitLeader(ctx, 15*time.Second)
		if err != nil {
			return err
		}
		n := l
		if !r.leader {
			n = e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
		}
		if err := e.diskErrorRound(ctx, n, r.errno, r.d); err != nil {
			return err
		}
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
	}
	return nil
}
