package main

// Process-level tests of a full disk: a real server whose data directory
// is on a small tmpfs (mounted here, so they need root), filled by the
// server's own writes and by a ballast file the test grows and removes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// mountTmpfs mounts a tmpfs of size (e.g. "96m") on a new temporary
// directory, unmounted when the test ends (after the servers it started
// were killed: cleanups run last-registered first).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process-level test skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a small tmpfs as a real full filesystem")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root and a kernel that allows it here): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// freeBytes is the free space of dir's filesystem, as the server's guard
// reads it.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}

// writeBallast writes a file of size bytes (real pages: tmpfs allocates
// them as they are written).
func writeBallast(t *testing.T, path string, size int64) {
	t.Helper()
	if size <= 0 {
		t.Fatalf("ballast of %d bytes: the filesystem is fuller than the test expects", size)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatalf("ballast: %v", err)
		}
		left -= n
	}
}

// bulkyMetadata is just under the 4 KiB a lease's metadata may carry, not
// compressible, distinct per lease.
func bulkyMetadata(seed int) map[string]string {
	m := map[string]string{}
	for i := range 4 {
		var b strings.Builder
		x := uint32(seed*7919 + i*104729 + 1)
		for b.Len() < 960 {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			fmt.Fprintf(&b, "%08x", x)
		}
		m[fmt.Sprint("m", i)] = b.String()[:960]
	}
	return m
}

// getStatus is a GET's status and body.
func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue is the value of an unlabelled series on /metrics ("" when
// absent).
func metricValue(t *testing.T, s *server, name string) string {
	t.Helper()
	_, body := getStatus(t, "http://"+s.http+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestProcessDiskGuardRefusesGrowth fills a 96 MiB filesystem with
// acquires carrying metadata (their snapshots take the space) until the
// free-space guard refuses them: renewals, heartbeats and releases still
// work, acquires and new sessions get 429 RESOURCE_EXHAUSTED naming
// min_free_disk, /healthz stays 200; once a ballast file is removed,
// acquires resume.
func TestProcessDiskGuardRefusesGrowth(t *testing.T) {
	t.Parallel() // its own tmpfs and server; mostly waiting on them
	mnt := mountTmpfs(t, "96m")
	const minFree = 24 << 20
	s := newServer(t, "--min-free-disk", "24MiB", "--snapshot-threshold", "200", "--snapshot-interval", "500ms")
	s.dataDir = filepath.Join(mnt, "data")
	s.start()
	c := s.client(t)
	ctx := context.Background()

	// Leave 6 MiB above the threshold: the snapshots of a few hundred
	// leases' metadata take it.
	ballast := filepath.Join(mnt, "ballast")
	writeBallast(t, ballast, freeBytes(t, mnt)-minFree-6<<20)
	t.Logf("free after the ballast: %d MiB", freeBytes(t, mnt)>>20)

	var (
		mu      sync.Mutex
		held    []*wire.Lease
		refusal error
		other   error
		seq     atomic.Int64
		stop    atomic.Bool
	)
	deadline := time.Now().Add(3 * time.Minute)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && time.Now().Before(deadline) {
				i := int(seq.Add(1))
				l, err := c.Acquire(ctx, wire.AcquireRequest{Key: fmt.Sprintf("fill/%d/%d", w, i), Holder: fmt.Sprint("w", w),
					TTLMS: 120000, Metadata: bulkyMetadata(i)})
				mu.Lock()
				switch {
				case err == nil:
					held = append(held, l)
				case client.ErrorCode(err) == wire.CodeResourceExhausted:
					if refusal == nil {
						refusal = err
					}
					stop.Store(true)
				default:
					if other == nil {
						other = err
					}
					stop.Store(true)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if other != nil {
		t.Fatalf("an acquire failed otherwise than refused by the guard: %v\nlog:\n%s", other, s.log())
	}
	if refusal == nil {
		t.Fatalf("no acquire refused after %d grants within the deadline (free %d MiB)", len(held), freeBytes(t, mnt)>>20)
	}
	t.Logf("refused after %d grants; free %d MiB", len(held), freeBytes(t, mnt)>>20)

	// The refusal: 429 RESOURCE_EXHAUSTED, field min_free_disk, a clear
	// message; it lasts, and new sessions get it too.
	checkRefusal := func(what string, err error) {
		t.Helper()
		var we *wire.Error
		if client.StatusCode(err) != 429 || client.ErrorCode(err) != wire.CodeResourceExhausted || !errors.As(err, &we) ||
			we.Field != "min_free_disk" || we.Limit != minFree ||
			!strings.Contains(we.Message, "free disk space is low") || !strings.Contains(we.Message, "--min-free-disk") {
			t.Fatalf("%s: %v (%+v), want 429 RESOURCE_EXHAUSTED field min_free_disk limit %d naming --min-free-disk", what, err, we, minFree)
		}
	}
	checkRefusal("first refusal", refusal)
	_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "after", Holder: "x", TTLMS: 10000})
	checkRefusal("acquire while low", err)
	_, err = c.CreateSession(ctx, wire.SessionRequest{Holder: "x", TTLMS: 10000})
	checkRefusal("session create while low", err)
	if v := metricValue(t, s, "leasehold_writes_refused_disk"); v != "1" {
		t.Errorf("leasehold_writes_refused_disk = %q while refusing, want 1", v)
	}
	if v := metricValue(t, s, "leasehold_disk_low"); v != "1" {
		t.Errorf("leasehold_disk_low = %q while refusing, want 1", v)
	}
	// Low on space is not unhealthy: the server keeps its holders safe.
	if code, body := getStatus(t, "http://"+s.http+"/healthz"); code != 200 {
		t.Errorf("/healthz while low: %d %s", code, body)
	}

	// What keeps holders safe and frees space still works.
	if len(held) < 3 {
		t.Fatalf("only %d leases granted before the refusal", len(held))
	}
	if _, err := c.Renew(ctx, held[0].LeaseID, held[0].Token, 0); err != nil {
		t.Fatalf("renew while low: %v", err)
	}
	res, err := c.Heartbeat(ctx, []wire.HeartbeatItem{{LeaseID: held[1].LeaseID, Token: held[1].Token}})
	if err != nil || len(res) != 1 || res[0].Error != nil {
		t.Fatalf("heartbeat while low: %v %+v", err, res)
	}
	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: held[2].LeaseID, Token: held[2].Token}); err != nil {
		t.Fatalf("release while low: %v", err)
	}

	// Space comes back: acquires resume within a few polls.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	var last error
	resumeBy := time.Now().Add(30 * time.Second)
	for {
		_, last = c.Acquire(ctx, wire.AcquireRequest{Key: "resumed", Holder: "x", TTLMS: 10000})
		if last == nil {
			break
		}
		if time.Now().After(resumeBy) {
			t.Fatalf("acquires did not resume within 30s of freeing space (free %d MiB): %v", freeBytes(t, mnt)>>20, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if v := metricValue(t, s, "leasehold_writes_refused_disk"); v != "0" {
		t.Errorf("leasehold_writes_refused_disk = %q after space came back, want 0", v)
	}
	if strings.Count(s.log(), "free disk space is below --min-free-disk") == 0 {
		t.Errorf("the server did not log the guard's refusal")
	}
}

// walTestSegment is the raft-wal segment size of TestProcessDiskFullLogWedgeExits'
// server (LEASEHOLD_TEST_WAL_SEGMENT_SIZE): filling raft-wal's own 64 MiB
// took about 40 s of writes under the race detector, and the size of the
// segment changes nothing of the wedge.
const walTestSegment = 8 << 20

// TestProcessDiskFullLogWedgeExits fills the disk past the guard (set
// low) of a server with its log in wal/: the log's rotation to a new
// segment (8 MiB here) fails and raft-wal refuses every later append.
// /healthz then fails with the reason; once space is freed the server
// exits with status 74 and a message saying what happened, and a restart
// recovers every acknowledged lease.
func TestProcessDiskFullLogWedgeExits(t *testing.T) {
	t.Parallel() // its own tmpfs and server; mostly waiting on them
	mnt := mountTmpfs(t, "48m")
	// raft-wal's wedge: with raft.db's log (the default) the append
	// fails and the next one succeeds once there is room.
	s := newServer(t, "--min-free-disk", "1MiB", "--retention", "100ms", "--log-failure-timeout", "10m", "--raft-log", "wal")
	s.env = []string{fmt.Sprintf("%s=%d", testWALSegmentEnv, walTestSegment)}
	s.dataDir = filepath.Join(mnt, "data")
	s.start()
	c := s.client(t)
	ctx := context.Background()
	if segs, _ := filepath.Glob(filepath.Join(s.dataDir, "wal", "*.wal")); len(segs) != 1 {
		t.Fatalf("segment files %v, want one", segs)
	} else if st, err := os.Stat(segs[0]); err != nil || st.Size() != walTestSegment {
		t.Fatalf("segment %s: %v, want %d bytes (%s)", segs[0], err, walTestSegment, testWALSegmentEnv)
	}

	// The first segment is allocated; leave 6 MiB free for the stable
	// store and snapshots, less than another segment takes.
	ballast := filepath.Join(mnt, "ballast")
	writeBallast(t, ballast, freeBytes(t, mnt)-6<<20)
	t.Logf("free after the ballast: %d MiB", freeBytes(t, mnt)>>20)

	// Acquire with bulky metadata and release (the state stays small,
	// the log grows), keeping every 50th lease, until writes fail.
	var (
		mu       sync.Mutex
		kept     []*wire.Lease
		grants   int
		failures []error
		seq      atomic.Int64
		stop     atomic.Bool
	)
	deadline := time.Now().Add(5 * time.Minute)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && time.Now().Before(deadline) {
				i := int(seq.Add(1))
				keep := i%50 == 0
				req := wire.AcquireRequest{Key: fmt.Sprintf("w/%d/%d", w, i), Holder: fmt.Sprint("w", w), TTLMS: 600000}
				if !keep {
					req.Metadata = bulkyMetadata(i)
				}
				l, err := c.Acquire(ctx, req)
				if err == nil && !keep {
					_, err = c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
				}
				mu.Lock()
				if l != nil {
					grants++
				}
				if l != nil && keep {
					kept = append(kept, l)
				}
				if err != nil {
					failures = append(failures, err)
					// A slow machine may fail a write before the disk
					// fills: go on until the server saw it full.
					if len(failures) >= 3 && strings.Contains(s.log(), "no space left on device") {
						stop.Store(true)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(failures) == 0 {
		t.Fatalf("no write failed within the deadline after %d grants (free %d MiB)", grants, freeBytes(t, mnt)>>20)
	}
	t.Logf("%d grants (%d kept), then writes failed: %v", grants, len(kept), failures[:min(3, len(failures))])
	// The guard (set low, below what the ballast leaves) must not trip
	// while the disk still has room: only the wedge fills it. raft-wal's
	// rotation allocates the new segment, which takes the rest of the disk
	// (0 B free), and then fails; the guard may read those 0 B a moment
	// before the log's error is written, and then rightly refuses the
	// writes still coming. So a trip logged before the log's failure must
	// have read 0 B. (Which writer records its failure first says nothing:
	// under load one refused by the guard recorded before the one whose
	// append hit the full disk.)
	logText := s.log()
	full := strings.Index(logText, "no space left on device")
	if full < 0 {
		t.Fatalf("the server's log does not show the disk filling up:\n%s", tail(logText, 4000))
	}
	if guard := strings.Index(logText, "free disk space is below --min-free-disk"); guard >= 0 && guard < full {
		line, _, _ := strings.Cut(logText[guard:], "\n")
		if !strings.Contains(line, "free_bytes=0 ") {
			t.Fatalf("the guard tripped while the disk had room, before the log failed (set low, it should not have):\n%s", line)
		}
	}
	if client.ErrorCode(failures[0]) == wire.CodeResourceExhausted {
		t.Logf("the first failure a writer recorded is the guard's, after the log failed: %v", failures[0])
	}

	// The server cannot write: /healthz says so (a liveness probe
	// restarts it); it does not exit while the disk has no room.
	var body string
	eventually(t, 30*time.Second, func() bool {
		var code int
		code, body = getStatus(t, "http://"+s.http+"/healthz")
		return code == 503
	})
	if !strings.Contains(body, "Raft log cannot be written") {
		t.Fatalf("/healthz while the log fails: %s", body)
	}
	if v := metricValue(t, s, "leasehold_log_store_failing"); v != "1" {
		t.Errorf("leasehold_log_store_failing = %q, want 1", v)
	}
	select {
	case <-s.exited:
		t.Fatalf("the server exited while the disk was still full:\n%s", tail(s.log(), 4000))
	case <-time.After(2 * time.Second):
	}

	// Space comes back: the log stays wedged, so the server exits with
	// its storage status and says why.
	freedAt := time.Now()
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("the server did not exit within 60s of freeing space:\n%s", tail(s.log(), 4000))
	}
	t.Logf("exited %v after space was freed", time.Since(freedAt).Round(100*time.Millisecond))
	if code := s.cmd.ProcessState.ExitCode(); code != exitStorage {
		t.Fatalf("exit status %d, want %d:\n%s", code, exitStorage, tail(s.log(), 4000))
	}
	lg := s.log()
	i := strings.LastIndex(lg, "error: storage failure: the Raft log cannot be written")
	if i < 0 || !strings.Contains(lg[i:], "restart") {
		t.Fatalf("the exit message does not say what happened:\n%s", tail(lg, 4000))
	}
	t.Logf("exit message: %s", strings.TrimSpace(lg[i:]))

	// A restart recovers every acknowledged lease. When the disk filled
	// while raft-wal created its next segment, raft-wal cannot reopen the
	// sealed one: every restart stops on it at the first append, and the
	// documented repair is to move the log to raft.db (migrate-log). Which
	// of the two happened depends on timing.
	logged := len(s.log())
	s.launch()
	if !readyOrExited(s, logged) {
		t.Logf("the restart stopped on raft-wal's sealed segment; repairing with migrate-log --to boltdb:\n%s", tail(s.log(), 600))
		if out, err := exec.Command(s.bin, "data", "migrate-log", "--data-dir", s.dataDir, "--to", "boltdb").CombinedOutput(); err != nil {
			t.Fatalf("migrate-log: %v\n%s", err, out)
		}
		s.extra = withoutFlag(s.extra, "--raft-log")
		s.start()
	}
	for _, l := range kept {
		got, err := c.Get(ctx, l.LeaseID)
		if err != nil || got.State != "active" || got.FencingToken != l.FencingToken {
			t.Fatalf("lease %s after the restart: %v %+v, want active with fencing token %d", l.LeaseID, err, got, l.FencingToken)
		}
	}
	if _, err := c.Acquire(ctx, wire.AcquireRequest{Key: "after-restart", Holder: "x", TTLMS: 10000}); err != nil {
		t.Fatalf("acquire after the restart: %v", err)
	}
	if code, body := getStatus(t, "http://"+s.http+"/healthz"); code != 200 {
		t.Fatalf("/healthz after the restart: %d %s", code, body)
	}
}

// TestProcessDiskFullBoltRecovers: the same full disk with the log in
// raft.db (the default store): appends fail while the disk is full
// (/healthz says so), and once space is freed the server goes on by
// itself, without exiting, with every acknowledged lease. The free-space
// guard is off: raft.db grows in small steps, so a guard would refuse the
// acquires before the disk filled, and only the leader's ticks would fill
// the rest, in minutes (TestProcessDiskGuardRefusesGrowth tests the guard).
func TestProcessDiskFullBoltRecovers(t *testing.T) {
	t.Parallel() // its own tmpfs and server; mostly waiting on them
	mnt := mountTmpfs(t, "64m")
	s := newServer(t, "--min-free-disk", "-1", "--retention", "100ms", "--log-failure-timeout", "10m")
	s.dataDir = filepath.Join(mnt, "data")
	s.start()
	c := s.client(t)
	ctx := context.Background()
	ballast := filepath.Join(mnt, "ballast")
	writeBallast(t, ballast, freeBytes(t, mnt)-6<<20)

	var (
		mu       sync.Mutex
		kept     []*wire.Lease
		failures []error
		seq      atomic.Int64
		stop     atomic.Bool
	)
	deadline := time.Now().Add(5 * time.Minute)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && time.Now().Before(deadline) {
				i := int(seq.Add(1))
				keep := i%50 == 0
				req := wire.AcquireRequest{Key: fmt.Sprintf("w/%d/%d", w, i), Holder: fmt.Sprint("w", w), TTLMS: 600000}
				if !keep {
					req.Metadata = bulkyMetadata(i)
				}
				l, err := c.Acquire(ctx, req)
				if err == nil && !keep {
					_, err = c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token})
				}
				mu.Lock()
				if l != nil && keep {
					kept = append(kept, l)
				}
				if err != nil {
					failures = append(failures, err)
					if len(failures) >= 3 && strings.Contains(s.log(), "no space left on device") {
						stop.Store(true)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if !strings.Contains(s.log(), "no space left on device") {
		t.Fatalf("the disk did not fill within the deadline (%d failures):\n%s", len(failures), tail(s.log(), 4000))
	}
	eventually(t, 30*time.Second, func() bool {
		code, _ := getStatus(t, "http://"+s.http+"/healthz")
		return code == 503
	})

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool {
		_, err := c.Acquire(ctx, wire.AcquireRequest{Key: "after-room", Holder: "x", TTLMS: 10000})
		return err == nil
	})
	eventually(t, 30*time.Second, func() bool {
		code, _ := getStatus(t, "http://"+s.http+"/healthz")
		return code == 200
	})
	select {
	case <-s.exited:
		t.Fatalf("the server exited:\n%s", tail(s.log(), 4000))
	default:
	}
	if strings.Contains(s.log(), "segment is sealed") {
		t.Fatal("a raft.db log reported raft-wal's sealed segment")
	}
	for _, l := range kept {
		got, err := c.Get(ctx, l.LeaseID)
		if err != nil || got.State != "active" || got.FencingToken != l.FencingToken {
			t.Fatalf("lease %s: %v %+v, want active with fencing token %d", l.LeaseID, err, got, l.FencingToken)
		}
	}
	t.Logf("%d kept leases served; the server recovered without a restart", len(kept))
}

// readyOrExited waits until s is ready (true) or has exited with the
// storage status on raft-wal's sealed segment (false: said in its log after
// byte logged); anything else fails the test.
func readyOrExited(s *server, logged int) bool {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + s.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		select {
		case <-s.exited:
			if lg := s.log(); s.cmd.ProcessState.ExitCode() == exitStorage && len(lg) > logged && strings.Contains(lg[logged:], "segment is sealed") {
				return false
			}
			s.t.Fatalf("server exited before ready; log:\n%s", s.log())
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.t.Fatalf("server not ready within 20s; log:\n%s", s.log())
	return false
}

// withoutFlag drops flag (and its value) from args.
func withoutFlag(args []string, flag string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		switch {
		case args[i] == flag:
			i++
		case strings.HasPrefix(args[i], flag+"="):
		default:
			out = append(out, args[i])
		}
	}
	return out
}
