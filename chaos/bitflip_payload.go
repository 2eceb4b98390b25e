package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// bitflipPayload: bits rot inside the payload of a stopped follower's
// latest commands, where the entry still decodes: one bit of a workload key
// ("chaos-..." turns "Chaos-..."), so the framing, the encoding and Raft
// all take the entry as sound, and only the command's checksum
// (fsm.VerifyChecksum) can tell. Restarted, the follower must refuse the
// entry itself (its log names the checksum mismatch) and never serve as
// ready a state built on it; then it is wiped and rejoins, as bitflip.
// This is the fault the corruption guard alone stops: the canary that
// turns the guard off (canary_no_guard) applies the changed key and serves
// a state that differs. Real processes only, as bitflip.
func (e *Env) bitflipPayload(ctx context.Context) error {
	// Refused by its checksum, not by anything else (a state check, a
	// framing test): the entry decodes, so only the checksum sees it.
	return e.damageLatest(ctx, latestDamage{name: "bitflip-payload", flips: "payload-flips", named: "bitflip-payload-checksum",
		what: "one bit of a key in each of its 5 latest commands flipped", mark: "checksum mismatch",
		unnamed: "did not serve, but its log names no checksum mismatch (%s): the damaged entries were not refused by their checksum",
		flip:    func(s cmdSpot) (int, byte, byte) { return s.keyAt, 'c', 'C' }})
}

// latestDamage is what bitflipType and bitflipPayload do to the latest
// commands of a stopped follower, and what its log must name once it
// refused them.
type latestDamage struct {
	name, flips, named string // the scenario; its counts of bytes changed and of refusals its log names
	what               string // what became of the commands
	mark, unnamed      string // what the log must name; the failure (of the log's path) when it does not
	// flip gives the byte of an entry's copy to change: at off, from
	// becomes to (a byte that is not from stays).
	flip func(cmdSpot) (off int, from, to byte)
}

// damageLatest kills a follower, changes every copy of its 5 latest
// command entries (d.flip), restarts it (restartDamaged) and, if it
// refused, requires its log to name d.mark.
func (e *Env) damageLatest(ctx context.Context, d latestDamage) error {
	if e.Tier != "netns" {
		return ErrUnsupported
	}
	l, err := e.WaitLeader(ctx, 10*time.Second)
	if err != nil {
		return err
	}
	f := e.Others(l)[e.Rng.IntN(e.C.Size()-1)]
	if err := e.C.Kill(f); err != nil {
		return err
	}
	e.damaged[f] = true
	spots, err := latestCommands(d.name, e.C.DataDir(f), 5)
	if err != nil {
		return err
	}
	var files []string
	for _, s := range spots {
		off, from, to := d.flip(s)
		if changed, err := patchByte(s.path, off, from, to); err != nil {
			return err
		} else if changed {
			files = append(files, fmt.Sprintf("%s@%d", filepath.Base(s.path), off))
		}
	}
	e.Count(d.flips, len(files))
	e.Note(d.name, fmt.Sprintf("node %d killed; %s (%d copies: %s)", f, d.what, len(files), strings.Join(files, ", ")), nil)
	var from int64
	if st, err := os.Stat(e.C.LogPath(f)); err == nil {
		from = st.Size()
	}
	refused, err := e.restartDamaged(ctx, d.name, f, l)
	if err != nil || !refused {
		return err
	}
	b, err := os.ReadFile(e.C.LogPath(f))
	if err != nil {
		return err
	}
	if !bytes.Contains(b[min(from, int64(len(b))):], []byte(d.mark)) {
		return fmt.Errorf("%s: node %d "+d.unnamed, d.name, f, e.C.LogPath(f))
	}
	e.Count(d.named, 1)
	return nil
}

// cmdSpot is one copy of a command entry of the workload in a log file:
// where its first workload key starts and where its type byte is (0, a
// command); rank orders entries by index.
type cmdSpot struct {
	path          string
	keyAt, typeAt int
	rank          uint64
}

// latestCommands finds every copy of the n most recent command entries
// of the workload (their data holds "chaos-") in the log files under dir
// (raft.db or raft-wal segments; every copy bbolt keeps of each). The
// most recent: a restart replays them (no snapshot covers them yet).
// raft.db keeps an entry as a msgpack map with sorted keys (..., "Data",
// "Extensions", "Index", "Term", "Type": 0); a raft-wal segment as
// varints (index, term, type 0, data length) before the data, whose first
// byte is the command's version (5, with a checksum), in index order,
// segment after segment.
func latestCommands(name, dir string, n int) ([]cmdSpot, error) {
	var spots []cmdSpot
	var segments []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".wal") {
			segments = append(segments, path)
		}
		return nil
	})
	sort.Strings(segments)
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		wal := strings.HasSuffix(path, ".wal")
		if err != nil || d.IsDir() || !(wal || filepath.Base(path) == "raft.db") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		seen := map[int]bool{} // entries (by their type byte) already spotted
		for i := 0; ; {
			j := bytes.Index(b[i:], []byte("chaos-"))
			if j < 0 {
				break
			}
			at := i + j
			i = at + 1
			off := typeByteOf(b, at, wal)
			if off < 0 || seen[off] {
				continue
			}
			seen[off] = true
			var rank uint64
			if wal {
				rank = uint64(sort.SearchStrings(segments, path))<<40 | uint64(off)
			} else if rank = boltEntryIndex(b, off); rank == 0 {
				continue
			}
			spots = append(spots, cmdSpot{path, at, off, rank})
		}
		return nil
	})
	if len(spots) == 0 {
		return nil, fmt.Errorf("%s: no command entry of the workload under %s", name, dir)
	}
	var order []uint64
	for _, s := range spots {
		order = append(order, s.rank)
	}
	slices.Sort(order)
	order = slices.Compact(order)
	latest := order[max(0, len(order)-n):]
	return slices.DeleteFunc(spots, func(s cmdSpot) bool { _, found := slices.BinarySearch(latest, s.rank); return !found }), nil
}

// patchByte sets the byte at off of the file at path to to if it is from,
// and reports whether it did.
func patchByte(path string, off int, from, to byte) (bool, error) {
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer fh.Close()
	var b [1]byte
	if _, err := fh.ReadAt(b[:], int64(off)); err != nil || b[0] != from {
		return false, err
	}
	_, err = fh.WriteAt([]byte{to}, int64(off))
	return err == nil, err
}
