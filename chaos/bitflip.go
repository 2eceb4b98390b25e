package chaos

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// bitflip is the bit-rot nemesis: a follower is killed, a few bits are
// flipped in the used part of its log segments and snapshot files, and it
// is restarted. It must never serve a state that differs from the others'
// as ready: it refuses (a log entry whose checksum does not match stops
// it; Raft refuses a snapshot whose CRC does not match), or the state
// check takes it out of service, or the flips changed nothing it reads.
// Whatever it did, it is then replaced as an operator would (wiped, and
// rejoined empty) unless it is ready with the cluster's state, and the
// cluster keeps serving throughout. Real processes only: an in-process
// server that refuses a damaged entry takes the test binary down with it.
func (e *Env) bitflip(ctx context.Context) error {
	if e.Tier != "netns" {
		return ErrUnsupported
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	// Flips can all be harmless (in freed pages of raft.db, or in entries
	// a snapshot already covers, which a restart does not replay): such a
	// round proves nothing, so another follows, up to bitflipRounds; the
	// scenario needs one round whose damage the server refused.
	for round := 1; ; round++ {
		harmless, err := e.bitflipRound(ctx, l, f)
		if err != nil || !harmless {
			return err
		}
		if round == bitflipRounds {
			return nil
		}
		e.Note("bitflip", fmt.Sprintf("node %d: round %d changed nothing it reads; flipping again", f, round), nil)
	}
}

// bitflipRounds bounds the bitflip scenario's rounds.
const bitflipRounds = 4

// guardError is a scenario's own safety check failing (as opposed to the
// nemesis failing to run): its verdict is named Checker, so a canary can
// require it.
type guardError struct {
	checker string
	err     error
}

func (g *guardError) Error() string { return g.err.Error() }
func (g *guardError) Unwrap() error { return g.err }

// bitflipRound kills follower f, flips bits in its files, restarts it and
// watches it (leader l has the cluster's state); harmless reports that f
// came back ready with the cluster's state (the flips changed nothing it
// reads). Otherwise f refused or took itself out, and was wiped and
// rejoined.
func (e *Env) bitflipRound(ctx context.Context, l, f int) (harmless bool, err error) {
	if err := e.C.Kill(f); err != nil {
		return false, err
	}
	e.damaged[f] = true
	flips, files, err := flipBits(e.Rng, e.C.DataDir(f), 3)
	if err != nil {
		return false, err
	}
	e.Count("bitflips", flips)
	e.Note("bitflip", fmt.Sprintf("node %d killed; %d bits flipped in %s", f, flips, strings.Join(files, ", ")), nil)
	refused, err := e.restartDamaged(ctx, "bitflip", f, l)
	return !refused && err == nil, err
}

// restartDamaged restarts node f, killed and its files damaged, and
// watches it against leader l for longer than a server's check at start:
// ready with a state that differs from l's is the one failure. Unless it
// comes back ready with the cluster's state (counted as name-harmless), it
// is counted as name-refused, wiped and rejoins empty, as an operator
// would have it; refused says so.
func (e *Env) restartDamaged(ctx context.Context, name string, f, l int) (refused bool, err error) {
	if err := e.C.Restart(f); err != nil {
		e.Note(name, fmt.Sprintf("node %d did not restart", f), err)
	}
	// Watch it: ready with a state that differs is the one failure.
	// Longer than a server's check at start (node.startupCheckFor, 30 s):
	// one still in it is not ready, which must not pass for a refusal.
	deadline := time.Now().Add(40 * time.Second)
	verdict := "refused or out of service"
	for time.Now().Before(deadline) {
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return false, err
		}
		if !e.C.Alive(f) || !ready(ctx, e.C, f) {
			continue
		}
		same, err := e.sameStateAs(ctx, f, l)
		if err != nil {
			continue
		}
		if !same && ready(ctx, e.C, f) {
			return false, &guardError{"bitflip-guard", fmt.Errorf("%s: node %d serves a state that differs from node %d's as ready", name, f, l)}
		}
		if same {
			verdict = "ready with the cluster's state"
		}
	}
	e.Note(name, fmt.Sprintf("node %d: %s", f, verdict), nil)
	if verdict == "ready with the cluster's state" && e.C.Alive(f) && ready(ctx, e.C, f) {
		e.Count(name+"-harmless", 1)
		return false, nil
	}
	e.Count(name+"-refused", 1)
	// As an operator would: wipe it and let it rejoin empty.
	if err := e.C.Wipe(f); err != nil {
		return true, err
	}
	e.Count("wipes", 1)
	return true, e.rejoinWiped(ctx, f, true)
}

// flipBits flips n bits, each in a random file among the log files (raft-wal
// segments, or raft.db: there within a log entry's command, in the
// workload's keys) and snapshot files under dir, at a random offset of the
// part of the file in use (segments are preallocated: their zero tail is
// left alone).
func flipBits(rng *rand.Rand, dir string, n int) (int, []string, error) {
	var cands []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if strings.HasSuffix(path, ".wal") || filepath.Base(path) == "state.bin" || filepath.Base(path) == "raft.db" {
			cands = append(cands, path)
		}
		return nil
	})
	if len(cands) == 0 {
		return 0, nil, fmt.Errorf("bitflip: no log segment or snapshot under %s", dir)
	}
	flipped := 0
	var touched []string
	for range n {
		path := cands[rng.IntN(len(cands))]
		b, err := os.ReadFile(path)
		if err != nil {
			return flipped, touched, err
		}
		var off int
		if filepath.Base(path) == "raft.db" {
			// bbolt's own pages (meta, branches, free lists) are not
			// what rots here: a byte of a log entry's command is.
			var at []int
			for i := 0; ; {
				j := bytes.Index(b[i:], []byte("chaos-"))
				if j < 0 {
					break
				}
				at = append(at, i+j)
				i += j + 1
			}
			if len(at) == 0 {
				continue
			}
			off = at[rng.IntN(len(at))] + rng.IntN(len("chaos-"))
		} else {
			end := len(b)
			for end > 0 && b[end-1] == 0 {
				end--
			}
			if end < 64 {
				continue
			}
			// Past the file's own header, within what is written.
			off = 32 + rng.IntN(end-32)
		}
		b[off] ^= 1 << rng.IntN(8)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return flipped, touched, err
		}
		flipped++
		touched = append(touched, fmt.Sprintf("%s@%d", filepath.Base(path), off))
	}
	return flipped, touched, nil
}

// ready reports whether node i answers /readyz with 200.
func ready(ctx context.Context, c Cluster, i int) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.HTTPAddr(i)+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sameStateAs compares the state hashes of nodes a and b at one coming
// index, asked of both at once: asked one after the other, the second had
// often passed the index by the time the first answered (INDEX_PASSED), and
// a busy cluster never compared at all.
func (e *Env) sameStateAs(ctx context.Context, a, b int) (bool, error) {
	lb, err := e.Local(ctx, b, 0, time.Second)
	if err != nil {
		return false, err
	}
	at := lb.AppliedIndex + 100
	var sums [2]string
	var errs [2]error
	var wg sync.WaitGroup
	for k, i := range []int{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ls, err := e.Local(ctx, i, at, 10*time.Second)
			if err != nil {
				errs[k] = err
				return
			}
			sums[k] = ls.StateHash
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return false, err
	}
	return sums[0] == sums[1], nil
}

// bitflipLeader: bits rot in the running leader's log (its files change
// under it, as a failing disk's would), within entries it has applied; a
// follower is then wiped and rejoins, catching up from that leader. The
// follower must come back with the cluster's state and never stop on an
// entry from the leader's damaged disk: the leader refuses to send an entry
// whose checksum no longer matches (the follower gets a snapshot instead).
// Real processes only (an in-process server that stopped on a damaged
// entry would take the test binary down with it).
func (e *Env) bitflipLeader(ctx context.Context) error {
	if e.Tier != "netns" {
		return ErrUnsupported
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	flips, files, err := flipLogBits(e.Rng, e.C.DataDir(l), 3)
	if err != nil {
		return err
	}
	e.Count("bitflips", flips)
	e.Note("bitflip-leader", fmt.Sprintf("leader %d: %d bits flipped in its log while it runs: %s", l, flips, strings.Join(files, ", ")), nil)
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	if err := e.C.Wipe(f); err != nil {
		return err
	}
	e.Count("wipes", 1)
	if err := e.rejoinWiped(ctx, f, true); err != nil {
		return err
	}
	// The rejoined follower catches up from the leader: ready, with the
	// cluster's state, and not stopped on a damaged entry on the way.
	deadline := time.Now().Add(60 * time.Second)
	last := "not ready"
	for {
		if err := sleepCtx(ctx, time.Second); err != nil {
			return err
		}
		if e.C.Alive(f) && ready(ctx, e.C, f) {
			same, err := e.sameStateAs(ctx, f, l)
			if err == nil && same {
				e.Count("bitflip-leader-caught-up", 1)
				return nil
			}
			last = fmt.Sprintf("ready; same state %v, %v", same, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bitflip-leader: node %d did not catch up from leader %d with the cluster's state within 60 s (alive %v; last look: %s)",
				f, l, e.C.Alive(f), last)
		}
	}
}

// flipLogBits flips n bits of log entries' commands in the log files under
// dir (raft.db or raft-wal segments), within the workload's keys, in place:
// the server keeps running on the files.
func flipLogBits(rng *rand.Rand, dir string, n int) (int, []string, error) {
	type spot struct {
		path string
		off  int
	}
	var spots []spot
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(path, ".wal") || filepath.Base(path) == "raft.db") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for i := 0; ; {
			j := bytes.Index(b[i:], []byte("chaos-"))
			if j < 0 {
				break
			}
			spots = append(spots, spot{path, i + j + rng.IntN(len("chaos-"))})
			i += j + 1
		}
		return nil
	})
	if len(spots) == 0 {
		return 0, nil, fmt.Errorf("bitflip-leader: no log entry of the workload under %s", dir)
	}
	flipped := 0
	var touched []string
	for range n {
		s := spots[rng.IntN(len(spots))]
		fh, err := os.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return flipped, touched, err
		}
		var b [1]byte
		_, err = fh.ReadAt(b[:], int64(s.off))
		if err == nil {
			b[0] ^= 1 << rng.IntN(8)
			_, err = fh.WriteAt(b[:], int64(s.off))
		}
		fh.Close()
		if err != nil {
			return flipped, touched, err
		}
		flipped++
		touched = append(touched, fmt.Sprintf("%s@%d", filepath.Base(s.path), s.off))
	}
	return flipped, touched, nil
}

// bitflipType: the type of committed command entries rots on a stopped
// follower: one bit turns each of a few of its log's commands into a
// no-op, which Raft never hands to the state machine, and which the
// commands' own checksum does not cover. Restarted, it must refuse (stop
// at the first such entry) or come back with the cluster's state (the
// entries were below its snapshot); it never serves as ready a state that
// lost those commands. Then as bitflip. Real processes only, as bitflip.
func (e *Env) bitflipType(ctx context.Context) error {
	// Out of service is not enough: with more of the cluster damaged the
	// state check's majority could convict a healthy server instead. The
	// damaged server must have refused the entries itself.
	return e.damageLatest(ctx, latestDamage{name: "bitflip-type", flips: "type-flips", named: "bitflip-type-named",
		what: "its 5 latest commands turned into no-ops", mark: "index or type damaged",
		unnamed: "was taken out of service, but did not refuse a no-op that carries a command itself (no damaged entry named in %s)",
		flip:    func(s cmdSpot) (int, byte, byte) { return s.typeAt, 0, 1 }})
}

// boltEntryIndex reads the "Index" of the raft.db entry whose "Type" value
// is at off (msgpack: an unsigned integer after the key), or 0.
func boltEntryIndex(b []byte, off int) uint64 {
	i := bytes.LastIndex(b[max(0, off-48):off], []byte("\xa5Index"))
	if i < 0 {
		return 0
	}
	p := b[max(0, off-48)+i+len("\xa5Index"):]
	switch {
	case len(p) > 0 && p[0] < 0x80:
		return uint64(p[0])
	case len(p) > 2 && p[0] == 0xcc:
		return uint64(p[1])
	case len(p) > 2 && p[0] == 0xcd:
		return uint64(binary.BigEndian.Uint16(p[1:]))
	case len(p) > 4 && p[0] == 0xce:
		return uint64(binary.BigEndian.Uint32(p[1:]))
	case len(p) > 8 && p[0] == 0xcf:
		return binary.BigEndian.Uint64(p[1:])
	}
	return 0
}

// typeByteOf finds the type byte (0, a command) of the log entry whose
// data holds the byte at, or -1 (see flipEntryTypes).
func typeByteOf(b []byte, at int, wal bool) int {
	if !wal {
		key := []byte("\xa4Type\x00")
		if i := bytes.Index(b[at:min(len(b), at+1024)], key); i >= 0 {
			return at + i + len(key) - 1
		}
		return -1
	}
	for p := at - 1; p >= max(0, at-64); p-- {
		if b[p] != 0 {
			continue
		}
		l, w := binary.Uvarint(b[p+1:])
		start := p + 1 + w
		if w > 0 && start < at && b[start] == 5 && start+int(l) > at && l < 1<<16 {
			return p
		}
	}
	return -1
}
