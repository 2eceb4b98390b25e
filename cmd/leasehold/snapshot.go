package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

const snapshotUsage = "usage: leasehold snapshot save FILE | save --keep N DIR | restore --yes FILE | inspect FILE | downgrade FILE OUT [flags]"

func (a *app) snapshotCmd(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageErrorf("%s", snapshotUsage)
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprintln(a.stdout, snapshotUsage)
		return nil
	case "save":
		return a.snapshotSave(ctx, args)
	case "restore":
		return a.snapshotRestore(ctx, args)
	case "downgrade":
		return a.snapshotDowngrade(args)
	case "inspect":
		return a.snapshotInspect(args)
	}
	return usageErrorf("unknown snapshot command %q; %s", sub, snapshotUsage)
}

// snapshotSave is "snapshot save [--keep N] FILE|DIR": the cluster's state
// into FILE, or into a new timestamped file in DIR.
func (a *app) snapshotSave(ctx context.Context, args []string) error {
	fs := a.newFlagSet("snapshot save", "FILE | [--keep N] DIR",
		"Save a snapshot of the whole cluster state to FILE (admin scope; any node,\n"+
			"the leader takes it). The file is written to FILE.tmp, checked the way\n"+
			"'snapshot inspect' does (on the bytes as they are written), synced, then\n"+
			"renamed to FILE.\n"+
			"Given a directory (an existing one, or any path with --keep), the file is\n"+
			"DIR/leasehold-<UTC time>.snap, and with --keep N only the newest N such\n"+
			"files stay: older ones are deleted once the new one is saved and checked.\n"+
			"Other files in DIR are never touched.")
	cf := newClientFlags(fs)
	keep := fs.Int("keep", 0, "with a directory: keep the newest N snapshots in it, delete older ones (0: keep all)")
	target, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	if *keep < 0 {
		return usageErrorf("--keep %d: want 0 (keep all) or more", *keep)
	}
	st, statErr := os.Stat(target)
	isDir := statErr == nil && st.IsDir()
	if *keep > 0 && !isDir {
		if statErr == nil {
			return usageErrorf("--keep needs a directory; %s is a file", target)
		}
		if err := os.MkdirAll(target, 0o700); err != nil {
			return err
		}
		isDir = true
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	file := target
	if isDir {
		file = filepath.Join(target, snapshotFileName(time.Now()))
	}
	info, err := saveSnapshotFile(ctx, c, file)
	if err != nil {
		return err
	}
	var deleted []string
	if isDir && *keep > 0 {
		if deleted, err = pruneSnapshots(target, *keep); err != nil {
			return fmt.Errorf("saved %s, but pruning older snapshots failed: %w", file, err)
		}
	}
	if cf.json {
		return writeJSON(a.stdout, struct {
			*node.SnapshotInfo
			File    string   `json:"file"`
			Deleted []string `json:"deleted,omitempty"`
		}{info, file, deleted})
	}
	fmt.Fprintf(a.stdout, "saved a snapshot of the cluster to %s\n", file)
	for _, d := range deleted {
		fmt.Fprintf(a.stdout, "deleted the older snapshot %s\n", d)
	}
	return printSnapshotInfo(a.stdout, info)
}

// Snapshots saved into a directory are named snapshotPrefix + the UTC
// time (to the millisecond, so that names sort by age) + snapshotSuffix.
const (
	snapshotPrefix     = "leasehold-"
	snapshotSuffix     = ".snap"
	snapshotTimeLayout = "20060102T150405.000Z"
)

func snapshotFileName(t time.Time) string {
	return snapshotPrefix + t.UTC().Format(snapshotTimeLayout) + snapshotSuffix
}

// pruneSnapshots deletes all but the newest keep snapshots of dir (files
// named as snapshotFileName names them; nothing else) and returns the
// paths deleted, oldest first.
func pruneSnapshots(dir string, keep int) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var snaps []string
	for _, e := range entries {
		name := e.Name()
		stamp, ok := strings.CutPrefix(name, snapshotPrefix)
		if stamp, ok2 := strings.CutSuffix(stamp, snapshotSuffix); ok && ok2 && e.Type().IsRegular() {
			if _, err := time.Parse(snapshotTimeLayout, stamp); err == nil {
				snaps = append(snaps, name)
			}
		}
	}
	slices.Sort(snaps) // oldest first
	var deleted []string
	for len(snaps) > keep {
		p := filepath.Join(dir, snaps[0])
		if err := os.Remove(p); err != nil {
			return deleted, err
		}
		deleted = append(deleted, p)
		snaps = snaps[1:]
	}
	return deleted, nil
}

// snapshotRestore is "snapshot restore --yes FILE": the cluster's state
// from FILE.
func (a *app) snapshotRestore(ctx context.Context, args []string) error {
	fs := a.newFlagSet("snapshot restore", "--yes FILE",
		"Restore the state of the whole cluster from the snapshot in FILE (admin\n"+
			"scope; any node, the leader does it). A restore never goes backwards:\n"+
			"leases and sessions live at the restore stay as they are, with their\n"+
			"tokens, and keys in use stay held or in lock-delay; the file's other\n"+
			"leases and sessions come back with the remaining time they had when it was\n"+
			"saved, each lease with a new fencing token above every earlier one; the\n"+
			"file's leases on keys in use end (revoked, reason \"restore\"). The clock and\n"+
			"fencing tokens only go forward. The file is checked here and again by the\n"+
			"server before anything changes. --yes is required: nothing is asked\n"+
			"interactively.")
	cf := newClientFlags(fs)
	yes := fs.Bool("yes", false, "confirm that the whole cluster state is to be replaced")
	floor := fs.Uint64("fence-floor", 0, "the restored fencing tokens start above this one too: the fence_high of the cluster the file was saved from (GET /v1/cluster/local), when it issued tokens after the save; 0: none")
	file, err := a.parseOne(fs, args)
	if err != nil {
		return err
	}
	if !*yes {
		return usageErrorf("snapshot restore restores the state of the whole cluster from %s: "+
			"the leases and sessions of the file that are not live come back; add --yes to do it", file)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	info, err := restoreSnapshotFile(ctx, c, file, wire.RestoreOptions{FenceFloor: *floor})
	if err != nil {
		return err
	}
	if cf.json {
		return writeJSON(a.stdout, info)
	}
	fmt.Fprintf(a.stdout, "restored the cluster from %s\n", file)
	return printSnapshotInfo(a.stdout, info)
}

// snapshotDowngrade is "snapshot downgrade FILE OUT", offline: FILE
// rewritten for the release before grant keys.
func (a *app) snapshotDowngrade(args []string) error {
	fs := a.newFlagSet("snapshot downgrade", "FILE OUT",
		"Rewrite snapshot FILE as OUT for a rollback to the release before grant\n"+
			"keys (edecda9; docs/operations.md, \"Rolling back\"): the member registry's\n"+
			"grant keys are dropped (a restore into this release records them again;\n"+
			"grants signed by retired keys then stop verifying). A state with lease\n"+
			"groups or a staged restore is refused. Needs no server.")
	pos, err := a.parse(fs, args, nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageErrorf("snapshot downgrade takes FILE and OUT")
	}
	info, dropped, err := downgradeSnapshotFile(pos[0], pos[1])
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	fmt.Fprintf(a.stdout, "wrote %s for the previous release (grant keys dropped: %d servers)\n", pos[1], dropped)
	return printSnapshotInfo(a.stdout, info)
}

// snapshotInspect is "snapshot inspect FILE", offline: FILE checked and
// described.
func (a *app) snapshotInspect(args []string) error {
	fs := a.newFlagSet("snapshot inspect", "FILE",
		"Check a snapshot file the way a restore would (format, size, checksum, and\n"+
			"that the state decodes) and describe it. Needs no server.")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := a.parse(fs, args, nil, 0)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErrorf("snapshot inspect takes exactly one FILE")
	}
	f, err := os.Open(pos[0])
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := node.InspectSnapshotFile(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return fmt.Errorf("%s: %w", pos[0], err)
	}
	if *asJSON {
		return writeJSON(a.stdout, info)
	}
	return printSnapshotInfo(a.stdout, info)
}

// saveSnapshotFile downloads a snapshot into file (writeSnapshotFile),
// checked as "snapshot inspect" does before it takes file's name; its
// description, with the state's summary, is what the caller gets.
func saveSnapshotFile(ctx context.Context, c *client.Client, file string) (*node.SnapshotInfo, error) {
	return writeSnapshotFile(file, func(w io.Writer) (*node.SnapshotInfo, error) { return c.SaveSnapshot(ctx, w) }, true)
}

// writeSnapshotFile writes a snapshot into file: into file.tmp first,
// synced, then renamed, so that file is either complete or untouched.
// With check, the bytes written are checked as "snapshot inspect" does
// while they are written (checkWhileWriting), the rename waits for the
// check, and its description is returned.
func writeSnapshotFile(file string, write func(io.Writer) (*node.SnapshotInfo, error), check bool) (info *node.SnapshotInfo, err error) {
	tmp := file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	var w io.Writer = bw
	var ck *writeCheck
	if check {
		ck = checkWhileWriting(bw)
		w = ck
	}
	info, err = write(w)
	if ck != nil {
		// The check finishes while the file is synced.
		ck.end(err)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Sync()
	}
	if ck != nil {
		cinfo, cerr := ck.result(err)
		if cerr != nil && (err == nil || errors.Is(err, errCheckStopped)) {
			return nil, fmt.Errorf("the snapshot received does not check: %w", cerr)
		}
		info = cinfo
	}
	if err != nil {
		return nil, err
	}
	if err = f.Close(); err != nil {
		return nil, err
	}
	if err = os.Rename(tmp, file); err != nil {
		return nil, err
	}
	// Make the rename itself durable (best effort: not every system can
	// sync a directory).
	if d, derr := os.Open(filepath.Dir(file)); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return info, nil
}

// writeCheck writes to a writer and hands the same bytes to
// node.InspectSnapshotFile on a goroutine (checkWhileWriting), so that a
// download is decoded as it arrives instead of read back and decoded once
// written (at a million leases the decoding is seconds of CPU). Once the
// check has failed, writes fail with errCheckStopped (wrapping the
// check's error).
type writeCheck struct {
	io.Writer
	pw  *io.PipeWriter
	out chan writeCheckResult
}

type writeCheckResult struct {
	info *node.SnapshotInfo
	err  error
}

func checkWhileWriting(w io.Writer) *writeCheck {
	pr, pw := io.Pipe()
	ck := &writeCheck{Writer: io.MultiWriter(w, pw), pw: pw, out: make(chan writeCheckResult, 1)}
	go func() {
		info, err := node.InspectSnapshotFile(pr)
		if err == nil {
			// InspectSnapshotFile read to the end (bytes after the body
			// are an error): nothing is written after it.
			pr.CloseWithError(fmt.Errorf("%w: bytes after the end of the snapshot file", errCheckStopped))
			ck.out <- writeCheckResult{info, nil}
			return
		}
		pr.CloseWithError(fmt.Errorf("%w: %w", errCheckStopped, err))
		ck.out <- writeCheckResult{nil, err}
	}()
	return ck
}

// end ends the bytes, with the writer's error if it failed.
func (ck *writeCheck) end(werr error) { ck.pw.CloseWithError(werr) }

// result waits for the check (after end) and returns what it found; werr
// is the error of the write, if any: a check that only saw the bytes end
// early returns it.
func (ck *writeCheck) result(werr error) (*node.SnapshotInfo, error) {
	r := <-ck.out
	if r.err != nil && werr != nil && !errors.Is(werr, errCheckStopped) {
		return nil, werr
	}
	return r.info, r.err
}

// errCheckStopped is what writes fail with once checkWhileWriting's check
// failed.
var errCheckStopped = errors.New("the check stopped")

// downgradeSnapshotFile writes in, rewritten for the previous release, to
// out (through out.tmp, synced, then renamed).
func downgradeSnapshotFile(in, out string) (info *node.SnapshotInfo, dropped int, err error) {
	src, err := os.Open(in)
	if err != nil {
		return nil, 0, err
	}
	defer src.Close()
	tmp := out + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if info, dropped, err = node.DowngradeSnapshotFile(bufio.NewReaderSize(src, 1<<20), bw); err != nil {
		return nil, 0, err
	}
	if err = bw.Flush(); err != nil {
		return nil, 0, err
	}
	if err = f.Sync(); err != nil {
		return nil, 0, err
	}
	if err = f.Close(); err != nil {
		return nil, 0, err
	}
	return info, dropped, os.Rename(tmp, out)
}

// restoreSnapshotFile checks file (size and checksum) and uploads it.
func restoreSnapshotFile(ctx context.Context, c *client.Client, file string, opts wire.RestoreOptions) (*node.SnapshotInfo, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	_, body, err := node.ReadSnapshotFile(bufio.NewReaderSize(f, 1<<20))
	if err == nil {
		_, err = io.Copy(io.Discard, body)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	return c.RestoreSnapshotWith(ctx, bufio.NewReaderSize(f, 1<<20), opts)
}

func printSnapshotInfo(w io.Writer, info *node.SnapshotInfo) error {
	p := newKV(w)
	p.add("index", info.Index)
	p.add("term", info.Term)
	p.add("size", fmt.Sprintf("%d bytes", info.Size))
	p.add("created_at", timeString(&info.CreatedAt))
	p.add("saved_by", info.NodeID)
	p.add("sha256", info.SHA256)
	if s := info.State; s != nil {
		p.add("tick", s.Tick)
		p.add("tick_period", msString(s.TickPeriodMS))
		p.add("fencing_token", s.FencingToken)
		p.add("active_leases", s.ActiveLeases)
		p.add("active_sessions", s.ActiveSessions)
	}
	if info.RestoredIndex > 0 {
		p.add("restored_at_index", info.RestoredIndex)
	}
	if info.DroppedWaits > 0 {
		p.add("dropped_queued_acquires", info.DroppedWaits)
	}
	if info.RestoredIndex > 0 {
		p.add("leases_kept", info.Kept)
		p.add("leases_refenced", info.Refenced)
		p.add("leases_superseded", info.Superseded)
	}
	return p.flush()
}
