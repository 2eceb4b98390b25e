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
	flips, files, err := flipPayloads(e.C.DataDir(f), 5)
	if err != nil {
		return err
	}
	e.Count("payload-flips", flips)
	e.Note("bitflip-payload", fmt.Sprintf("node %d killed; one bit of a key in each of its 5 latest commands flipped (%d copies: %s)",
		f, flips, strings.Join(files, ", ")), nil)
	var from int64
	if st, err := os.Stat(e.C.LogPath(f)); err == nil {
		from = st.Size()
	}
	refused, err := e.restartDamaged(ctx, "bitflip-payload", f, l)
	if err != nil || !refused {
		return err
	}
	// Refused by its checksum, not by anything else (a state check, a
	// framing test): the entry decodes, so only the checksum sees it.
	b, err := os.ReadFile(e.C.LogPath(f))
	if err != nil {
		return err
	}
	if !bytes.Contains(b[min(from, int64(len(b))):], []byte("checksum mismatch")) {
		return fmt.Errorf("bitflip-payload: node %d did not serve, but its log names no checksum mismatch (%s): the damaged entries were not refused by their checksum",
			f, e.C.LogPath(f))
	}
	e.Count("bitflip-payload-checksum", 1)
	return nil
}

// flipPayloads flips one bit (0x20: 'c' to 'C') at the start of the
// workload key in each of the n most recent command entries under dir
// (raft.db or raft-wal segments; every copy bbolt keeps of each), and
// returns how many bytes it changed and where. The most recent: a restart
// replays them (no snapshot covers them yet). The entries still decode: a
// key's letter changes, not its length.
func flipPayloads(dir string, n int) (int, []string, error) {
	type spot struct {
		path string
		at   int    // the key's first byte
		rank uint64 // orders entries by index
	}
	var spots []spot
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
			spots = append(spots, spot{path, at, rank})
		}
		return nil
	})
	if len(spots) == 0 {
		return 0, nil, fmt.Errorf("bitflip-payload: no command entry of the workload under %s", dir)
	}
	var order []uint64
	for _, s := range spots {
		order = append(order, s.rank)
	}
	slices.Sort(order)
	order = slices.Compact(order)
	pick := map[uint64]bool{}
	for _, r := range order[max(0, len(order)-n):] {
		pick[r] = true
	}
	flipped := 0
	var touched []string
	for _, s := range spots {
		if !pick[s.rank] {
			continue
		}
		fh, err := os.OpenFile(s.path, os.O_RDWR, 0)
		if err != nil {
			return flipped, touched, err
		}
		var b [1]byte
		if _, err = fh.ReadAt(b[:], int64(s.at)); err == nil && b[0] == 'c' {
			b[0] ^= 0x20
			_, err = fh.WriteAt(b[:], int64(s.at))
			if err == nil {
				flipped++
				touched = append(touched, fmt.Sprintf("%s@%d", filepath.Base(s.path), s.at))
			}
		}
		fh.Close()
		if err != nil {
			return flipped, touched, err
		}
	}
	return flipped, touched, nil
}
