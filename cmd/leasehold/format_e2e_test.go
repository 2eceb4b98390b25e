package main

// The data directory across releases (issue 21 §2): the release before
// the data format check (prevRelease) must not start on a data directory
// this release wrote, and this release reads one the previous release
// wrote, every acknowledged lease included.

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
	"go.etcd.io/bbolt"
)

// prevRelease is the commit of the last release without the data format
// check (data format 1: the log in raft.db).
const prevRelease = "edecda9"

// prevFixture is a data directory prevRelease wrote (TestWritePrevFixture
// made it): a single server "e2e", tick period 1s, a Raft snapshot and
// about 100 log entries after it, stopped with SIGTERM. prevLeases lists
// the leases it acknowledged.
var (
	prevFixture = filepath.Join("testdata", "prev-release", "data.tar.gz")
	prevLeases  = filepath.Join("testdata", "prev-release", "leases.json")
)

var (
	prevOnce sync.Once
	prevPath string
	prevSkip string
	prevErr  error
)

// prevBinary is a leasehold server of prevRelease: $LEASEHOLD_PREV_BIN, or
// one built from this clone's git history. The build uses prevRelease's
// source with this release's go.mod and go.sum, so that it needs no
// download: the modules it reads its data dir with (raft v1.7.3,
// raft-boltdb/v2 v2.3.1, bbolt v1.5.0) are the release's own; only two
// indirect ones are newer (go-immutable-radix v1.3.0, golang-lru v0.5.4).
// Skips when neither is possible (a shallow clone, no git).
func prevBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("process-level test skipped in -short mode")
	}
	prevOnce.Do(func() {
		if p := os.Getenv("LEASEHOLD_PREV_BIN"); p != "" {
			prevPath = p
			return
		}
		if err := exec.Command("git", "cat-file", "-e", prevRelease+"^{commit}").Run(); err != nil {
			prevSkip = fmt.Sprintf("no %s in git history (%v) and no LEASEHOLD_PREV_BIN", prevRelease, err)
			return
		}
		dir, err := os.MkdirTemp("", "leasehold-prev")
		if err != nil {
			prevErr = err
			return
		}
		root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			prevErr = err
			return
		}
		// The source goes once the binary is built; the binary stays, as
		// buildBinary's does. -trimpath: the build cache serves the next
		// build from another temporary directory.
		src := filepath.Join(dir, "src")
		defer os.RemoveAll(src)
		if err := os.Mkdir(src, 0o700); err != nil {
			prevErr = err
			return
		}
		// git archive, run in a subdirectory, archives only that one.
		tarPath := filepath.Join(src, "src.tar")
		archive := exec.Command("git", "archive", "--format=tar", "-o", tarPath, prevRelease)
		archive.Dir = strings.TrimSpace(string(root))
		if out, err := archive.CombinedOutput(); err != nil {
			prevErr = fmt.Errorf("git archive %s: %v %s", prevRelease, err, out)
			return
		}
		if out, err := exec.Command("tar", "-x", "-C", src, "-f", tarPath).CombinedOutput(); err != nil {
			prevErr = fmt.Errorf("untar %s: %v %s", prevRelease, err, out)
			return
		}
		for _, f := range []string{"go.mod", "go.sum"} {
			b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(root)), f))
			if err == nil {
				err = os.WriteFile(filepath.Join(src, f), b, 0o644)
			}
			if err != nil {
				prevErr = err
				return
			}
		}
		prevPath = filepath.Join(dir, "leasehold-prev")
		build := goBuild("-mod=readonly", "-o", prevPath, "./cmd/leasehold")
		build.Dir = src
		build.Env = append(build.Env, "GOPROXY=off", "GOFLAGS=-buildvcs=false")
		if out, err := build.CombinedOutput(); err != nil {
			prevErr = fmt.Errorf("build %s: %v\n%s", prevRelease, err, out)
		}
	})
	if prevSkip != "" {
		t.Skip(prevSkip)
	}
	if prevErr != nil {
		t.Fatal(prevErr)
	}
	return prevPath
}

// prevLease is a lease prevRelease acknowledged, with its secret token.
type prevLease struct {
	LeaseID      string `json:"lease_id"`
	Key          string `json:"key"`
	Holder       string `json:"holder"`
	FencingToken uint64 `json:"fencing_token"`
	Token        string `json:"token"`
}

// acquireMany acquires n leases on keys prefix-0.. for holder, one request
// at a time (one Raft entry each).
func acquireMany(t *testing.T, c *client.Client, prefix, holder string, n int) []prevLease {
	t.Helper()
	var got []prevLease
	for i := range n {
		l, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: fmt.Sprintf("%s-%d", prefix, i), Holder: holder, TTLMS: 24 * 3600 * 1000})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, prevLease{l.LeaseID, l.Key, l.Holder, l.FencingToken, l.Token})
	}
	return got
}

// checkServes fails unless s serves every lease in want as granted, to
// its holder alone, with its fencing token and token, and grants a new
// lease (on key fresh) a fencing token above them all.
func checkServes(t *testing.T, s *server, want []prevLease, fresh string) {
	t.Helper()
	c := s.client(t)
	ctx := context.Background()
	var top uint64
	for _, w := range want {
		l, err := c.Get(ctx, w.LeaseID)
		if err != nil {
			t.Fatalf("lease %s (%s): %v", w.LeaseID, w.Key, err)
		}
		if l.Key != w.Key || l.Holder != w.Holder || l.FencingToken != w.FencingToken || l.State != "active" {
			t.Fatalf("lease %s = %s %s %d %s, want %s %s %d active", w.LeaseID, l.Key, l.Holder, l.FencingToken, l.State, w.Key, w.Holder, w.FencingToken)
		}
		top = max(top, w.FencingToken)
	}
	for _, w := range []prevLease{want[0], want[len(want)-1]} {
		if _, err := c.Acquire(ctx, wire.AcquireRequest{Key: w.Key, Holder: "intruder", TTLMS: 5000}); client.ErrorCode(err) != wire.CodeLeaseHeld {
			t.Fatalf("another holder's acquire of held key %s: %v, want %s", w.Key, err, wire.CodeLeaseHeld)
		}
		if _, err := c.Renew(ctx, w.LeaseID, w.Token, 0); err != nil {
			t.Fatalf("renew %s with its token: %v", w.LeaseID, err)
		}
	}
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: fresh, Holder: "new", TTLMS: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if l.FencingToken <= top {
		t.Fatalf("a new lease's fencing token %d is not above the previous release's %d", l.FencingToken, top)
	}
}

// dataFormat is the data format raft.db in dataDir records (0: none).
func dataFormat(t *testing.T, dataDir string) uint64 {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(dataDir, "raft.db"), 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var f uint64
	db.View(func(tx *bbolt.Tx) error {
		if b := tx.Bucket([]byte("conf")); b != nil {
			if v := b.Get([]byte("LeaseholdDataFormat")); len(v) == 8 {
				f = binary.BigEndian.Uint64(v)
			}
		}
		return nil
	})
	return f
}

// TestPreviousReleaseRefusesThisDataDir: the previous release, started on
// a data dir this release wrote, exits without ever reporting ready (it
// took the empty raft.db log for the whole history before: issue 21), and
// the directory still serves every lease on this release afterwards.
func TestPreviousReleaseRefusesThisDataDir(t *testing.T) {
	t.Parallel() // its own servers and directories
	prev := prevBinary(t)
	s := newServer(t)
	s.tickPeriod = "1s"
	s.extra = []string{"--snapshot-threshold", "50", "--snapshot-interval", "1s"}
	s.start()
	leases := acquireMany(t, s.client(t), "k", "h", 60)
	eventually(t, 20*time.Second, func() bool { return strings.Contains(s.log(), "snapshot complete") })
	leases = append(leases, acquireMany(t, s.client(t), "more", "h", 20)...)
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if f := dataFormat(t, s.dataDir); f != 2 {
		t.Fatalf("raft.db records data format %d, want 2", f)
	}

	runPrevOnDataDir(t, s, prev)
	s.start()
	checkServes(t, s, leases, "after")
}

// runPrevOnDataDir starts the previous release (bin) as s, on s's data dir
// and addresses, and fails unless it exits non-zero on the format guard
// without ever reporting ready.
func runPrevOnDataDir(t *testing.T, s *server, bin string) {
	t.Helper()
	old := *s
	old.bin, old.logPath = bin, filepath.Join(t.TempDir(), "prev-"+s.nodeID+".log")
	old.extra = withoutFlag(s.extra, "--raft-timeout") // newer than the previous release
	old.launch()
	deadline := time.After(30 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for done := false; !done; {
		if resp, err := hc.Get("http://" + old.http + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Fatalf("the previous release reported ready on this release's data dir; log:\n%s", old.log())
			}
		}
		select {
		case <-old.exited:
			done = true
		case <-deadline:
			t.Fatalf("the previous release still runs 30s after its start; log:\n%s", old.log())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if old.cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("the previous release exited 0; log:\n%s", old.log())
	}
	const want = "failed to get last log at index 18446744073709551615"
	if !strings.Contains(old.log(), want) {
		t.Fatalf("the previous release's log does not say %q:\n%s", want, old.log())
	}
	for _, line := range strings.Split(old.log(), "\n") {
		if strings.Contains(line, "error:") {
			t.Logf("the previous release: %s", line)
		}
	}
}

// TestPreviousReleaseRefusesAFollowersDataDir: in a cluster of three, a
// follower restarted on the previous release exits on the guard (it took
// an empty log, reported ready, took replication and panicked on entry
// type 17 before: issue 21); back on this release it catches up.
func TestPreviousReleaseRefusesAFollowersDataDir(t *testing.T) {
	t.Parallel() // its own servers and directories
	prev := prevBinary(t)
	c := newCluster(t)
	leader := c.waitFormed(c.nodes)
	var leases []*wire.Lease
	for i := range 20 {
		leases = append(leases, acquire(t, leader, fmt.Sprintf("k-%d", i), "h", time.Hour))
	}
	f := c.others(leader)[0]
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	runPrevOnDataDir(t, f, prev)
	f.start()
	for _, l := range leases {
		waitLeaseEverywhere(t, c.nodes, l, "active")
	}
}

// TestUpgradeFromPreviousRelease: this release opens a data dir the
// previous release wrote (the fixture), keeps its log in raft.db (no
// move at start, whatever --raft-log's default), records data format 2,
// and serves every lease the previous release acknowledged, those after
// its last snapshot included; then, stopped, 'leasehold data migrate-log'
// moves the log to wal/ with a backup, and the server serves them again.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	t.Parallel() // its own servers and directories
	b, err := os.ReadFile(prevLeases)
	if err != nil {
		t.Fatal(err)
	}
	var want []prevLease
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	s := newServer(t)
	s.tickPeriod = "1s"
	if err := untarGz(prevFixture, s.dataDir); err != nil {
		t.Fatal(err)
	}
	if f := dataFormat(t, s.dataDir); f != 0 {
		t.Fatalf("the fixture records data format %d", f)
	}
	s.start()
	if !strings.Contains(s.log(), "data dir upgraded") || strings.Contains(s.log(), "moving the raft log") {
		t.Fatalf("want the upgrade without a log move in the log:\n%s", s.log())
	}
	checkServes(t, s, want, "after-upgrade")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if f := dataFormat(t, s.dataDir); f != 2 {
		t.Fatalf("raft.db records data format %d after the upgrade, want 2", f)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "wal")); !os.IsNotExist(err) {
		t.Fatalf("wal/ exists after the upgrade (%v)", err)
	}
	r := runBinary(t, "data", "migrate-log", "--data-dir", s.dataDir, "--to", "wal")
	if r.status != 0 || !strings.Contains(r.stdout, "from boltdb to wal") || !strings.Contains(r.stdout, "backup: "+filepath.Join(s.dataDir, "log-backup-")) {
		t.Fatalf("migrate-log: %d\n%s\n%s", r.status, r.stdout, r.stderr)
	}
	s.start()
	checkServes(t, s, want[:1], "after-migrate")
}

// TestRaftLogFlagAndMigrateLog: --raft-log picks a new data dir's log
// store (and the new dir is not said to be upgraded); a restart with the other one is refused, both named; the move is
// refused while the server runs, and done once it is stopped, with a
// backup; the server then serves every lease again on the other store.
func TestRaftLogFlagAndMigrateLog(t *testing.T) {
	t.Parallel() // its own servers and directories
	s := newServer(t, "--raft-log", "wal")
	s.start()
	if strings.Contains(s.log(), "data dir upgraded") {
		t.Fatalf("a new data dir is not upgraded, yet its log says so:\n%s", s.log())
	}
	leases := acquireMany(t, s.client(t), "k", "h", 20)
	r := runBinary(t, "data", "migrate-log", "--data-dir", s.dataDir, "--to", "boltdb")
	if r.status == 0 || !strings.Contains(r.stderr, "a leasehold server runs on data dir") {
		t.Fatalf("migrate-log with the server running: %d\n%s\n%s", r.status, r.stdout, r.stderr)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	s.extra = []string{"--raft-log", "boltdb"}
	s.launch()
	<-s.exited
	if code := s.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(s.log(), "--raft-log boltdb, but data dir "+s.dataDir+" keeps its raft log in wal/ (wal)") {
		t.Fatalf("a wal data dir started with --raft-log boltdb: exit %d; log:\n%s", code, s.log())
	}
	r = runBinary(t, "data", "migrate-log", "--data-dir", s.dataDir, "--to", "boltdb")
	if r.status != 0 || !strings.Contains(r.stdout, "from wal to boltdb") || !strings.Contains(r.stdout, "and the wal/ directory") {
		t.Fatalf("migrate-log: %d\n%s\n%s", r.status, r.stdout, r.stderr)
	}
	s.start()
	checkServes(t, s, leases, "after-migrate")
}

// TestWritePrevFixture writes the fixture of TestUpgradeFromPreviousRelease
// with the previous release: LEASEHOLD_WRITE_PREV_FIXTURE=1 go test -run
// TestWritePrevFixture ./cmd/leasehold/ (LEASEHOLD_PREV_BIN, or git
// history, for the binary).
func TestWritePrevFixture(t *testing.T) {
	if os.Getenv("LEASEHOLD_WRITE_PREV_FIXTURE") == "" {
		t.Skip("set LEASEHOLD_WRITE_PREV_FIXTURE=1 to write the fixture")
	}
	prev := prevBinary(t)
	s := newServer(t)
	s.bin, s.tickPeriod = prev, "1s"
	s.extra = []string{"--snapshot-threshold", "200", "--snapshot-interval", "1s"}
	s.start()
	leases := acquireMany(t, s.client(t), "before-snapshot", "h1", 300)
	eventually(t, 30*time.Second, func() bool { return strings.Contains(s.log(), "snapshot complete") })
	leases = append(leases, acquireMany(t, s.client(t), "after-snapshot", "h2", 100)...)
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(leases, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(prevLeases), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prevLeases, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tarGz(s.dataDir, prevFixture); err != nil {
		t.Fatal(err)
	}
}

// tarGz writes the regular files under dir to a gzipped tar at path.
func tarGz(dir, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.ModTime = filepath.ToSlash(rel), time.Unix(0, 0)
		if err := tw.WriteHeader(hdr); err != nil || !fi.Mode().IsRegular() {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}

// untarGz extracts the gzipped tar at path into dir.
func untarGz(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(hdr.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("%s: %q is outside the directory", path, hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
				return err
			}
			out, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(hdr.Mode)&0o700)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}

// TestRollbackBySnapshot: the way back docs/operations.md gives (a
// snapshot saved from this release, restored into a new cluster of the
// previous release) brings every lease back, to its holder, renewable
// with its token, on a key another holder cannot take.
func TestRollbackBySnapshot(t *testing.T) {
	t.Parallel() // its own servers and directories
	prev := prevBinary(t)
	s := newServer(t)
	s.start()
	leases := acquireMany(t, s.client(t), "k", "h", 30)
	file := filepath.Join(t.TempDir(), "rollback.snap")
	if out, err := exec.Command(s.bin, "snapshot", "save", "--addr", s.http, file).CombinedOutput(); err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	// This release records grant keys in the member registry, which the
	// previous release does not decode: as is, it refuses the file before
	// anything changes; rewritten by snapshot downgrade, it restores it.
	old := newServer(t)
	old.bin = prev
	old.start()
	if out, err := exec.Command(prev, "snapshot", "restore", "--yes", "--addr", old.http, file).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "does not decode") {
		t.Fatalf("the previous release restored a file with grant keys: %v\n%s", err, out)
	}
	if err := old.stop(); err != nil {
		t.Fatal(err)
	}
	down := filepath.Join(t.TempDir(), "rollback-previous.snap")
	if out, err := exec.Command(s.bin, "snapshot", "downgrade", file, down).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "grant keys dropped: 1 servers") {
		t.Fatalf("snapshot downgrade: %v\n%s", err, out)
	}
	if out, err := exec.Command(prev, "snapshot", "inspect", down).CombinedOutput(); err != nil {
		t.Fatalf("the previous release's snapshot inspect of the downgraded file: %v\n%s", err, out)
	}
	file = down

	old = newServer(t)
	old.bin = prev
	old.start()
	if out, err := exec.Command(prev, "snapshot", "restore", "--yes", "--addr", old.http, file).CombinedOutput(); err != nil {
		t.Fatalf("the previous release's snapshot restore: %v\n%s\nserver log:\n%s", err, out, old.log())
	}
	c := old.client(t)
	ctx := context.Background()
	for _, w := range leases {
		l, err := c.Get(ctx, w.LeaseID)
		if err != nil {
			t.Fatalf("lease %s (%s) after the rollback: %v", w.LeaseID, w.Key, err)
		}
		if l.Key != w.Key || l.Holder != w.Holder || l.State != "active" {
			t.Fatalf("lease %s after the rollback = %s %s %s, want %s %s active", w.LeaseID, l.Key, l.Holder, l.State, w.Key, w.Holder)
		}
		if _, err := c.Acquire(ctx, wire.AcquireRequest{Key: w.Key, Holder: "intruder", TTLMS: 5000}); client.ErrorCode(err) != wire.CodeLeaseHeld {
			t.Fatalf("another holder's acquire of held key %s after the rollback: %v", w.Key, err)
		}
		if _, err := c.Renew(ctx, w.LeaseID, w.Token, 0); err != nil {
			t.Fatalf("renew %s with its token after the rollback: %v", w.LeaseID, err)
		}
	}
}

// TestNewerDataFormatRefused: a data dir that records a data format newer
// than this release's is refused at start, with both formats named,
// before the server reports ready.
func TestNewerDataFormatRefused(t *testing.T) {
	s := newServer(t)
	s.start()
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(filepath.Join(s.dataDir, "raft.db"), 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("conf")).Put([]byte("LeaseholdDataFormat"), binary.BigEndian.AppendUint64(nil, 3))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	before := len(s.log())
	s.launch()
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("the server still runs 30s after its start on a newer data format; log:\n%s", s.log())
	}
	if s.cmd.ProcessState.ExitCode() == 0 {
		t.Fatalf("the server exited 0; log:\n%s", s.log())
	}
	want := fmt.Sprintf("error: open node: cluster: data dir %s is in data format 3, written by a newer leasehold release; this release reads data formats 1 to 2", s.dataDir)
	if !strings.Contains(s.log(), want) {
		t.Fatalf("the log does not say %q:\n%s", want, s.log())
	}
	if strings.Contains(s.log()[before:], "ready: leader known") {
		t.Fatalf("the server reported ready; log:\n%s", s.log())
	}
	for _, line := range strings.Split(s.log(), "\n") {
		if strings.HasPrefix(line, "error:") {
			t.Logf("%s", line)
		}
	}
}
