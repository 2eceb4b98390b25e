package fsm_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// The pins of this file were taken from the codec before it was rewritten
// to list each body's fields once (codec_fields.go): the bytes of every
// command and of snapshots, and what Decode and Restore say of every
// prefix and of corrupted copies of them. Regenerate (only for an
// intended format change) with -update-pin; PIN_DUMP=file writes the
// listings the digests are of, to diff two versions of the code.

var updatePin = flag.Bool("update-pin", false, "rewrite testdata/codec_pin.txt")

const pinFile = "testdata/codec_pin.txt"

// pinCommands is one command of every type and variant, fields set.
func pinCommands() []struct {
	name string
	c    fsm.Command
} {
	h := func(s string) fsm.Hash { return fsm.HashOf(s) }
	meta := map[string]string{"owner": "alice", "ünï": "cödé", "": "empty key"}
	q := fsm.Quota{Leases: 1000, HolderLeases: 5, Sessions: 300, HolderSessions: 2, KeyWaiters: 70000, HolderWaiters: 1}
	acquire := &fsm.Acquire{LeaseID: "L1", Key: "k/1", Holder: "alice", Limit: 300, SessionID: "S1",
		SessionTokenHash: h("st"), TokenHash: h("t"), TTLMS: -5, TTLTicks: 1 << 40, Metadata: meta,
		IdemHash: h("idem"), Fingerprint: h("fp"), SealedToken: []byte{0, 1, 2, 250}, WaitTicks: 9,
		LockDelayMS: 2000, LockDelayTicks: 2, WallMS: 1700000000000, Quota: q}
	data := []byte("restore chunk data")
	cmds := []struct {
		name string
		c    fsm.Command
	}{
		{"tick", &fsm.Tick{Tick: 5, WallMS: -1, PeriodMS: 1000, RetainTicks: 300}},
		{"tick-retain", &fsm.Tick{Tick: 1 << 33, WallMS: 1700000000000, PeriodMS: 250, RetainTicks: 8, RetainMax: 100000}},
		{"tick-limited", &fsm.Tick{Tick: 7, WallMS: 7000, PeriodMS: 1000, RetainTicks: 8, RetainMax: 3, ExpireMax: 129}},
		{"expire", &fsm.Expire{Tick: 7, WallMS: 7001, Max: 64}},
		{"acquire", acquire},
		{"acquire-min", &fsm.Acquire{LeaseID: "L", Key: "k", Holder: "h", Limit: 1}},
		{"renew", &fsm.Renew{LeaseID: "L1", TokenHash: h("t"), TTLMS: 9000, TTLTicks: 9, WallMS: 5}},
		{"renew-meta", &fsm.Renew{LeaseID: "L1", TokenHash: h("t"), WallMS: 5, Metadata: meta, SetMetadata: true}},
		{"renew-meta-clear", &fsm.Renew{LeaseID: "L1", TokenHash: h("t"), WallMS: 5, SetMetadata: true}},
		{"release", &fsm.Release{LeaseID: "L2", TokenHash: h("t2"), SessionTokenHash: h("st"), Reason: "done", WallMS: 6}},
		{"revoke", &fsm.Revoke{LeaseID: "L1", Reason: "op", WallMS: -7}},
		{"heartbeat", &fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "L1", TokenHash: h("t")}, {LeaseID: "L2"}}, WallMS: 8}},
		{"heartbeat-meta", &fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "L1", TokenHash: h("t")},
			{LeaseID: "L2", TokenHash: h("t2"), SetMetadata: true, Metadata: meta}, {LeaseID: "L3", SetMetadata: true}}, WallMS: 8}},
		{"session-create", &fsm.SessionCreate{SessionID: "S1", Holder: "alice", TokenHash: h("st"), TTLMS: 10000,
			TTLTicks: 10, Metadata: meta, WallMS: 9, Quota: q}},
		{"session-heartbeat", &fsm.SessionHeartbeat{SessionID: "S1", TokenHash: h("st"), WallMS: 9}},
		{"session-heartbeat-meta", &fsm.SessionHeartbeat{SessionID: "S1", TokenHash: h("st"), WallMS: 9, SetMetadata: true, Metadata: meta}},
		{"session-end", &fsm.SessionEnd{SessionID: "S1", TokenHash: h("st"), Force: true, WallMS: 10}},
		{"release-holder", &fsm.ReleaseHolder{Holder: "alice", Reason: "restart", WallMS: 11}},
		{"cancel-wait", &fsm.CancelWait{LeaseID: "L1", Key: "k"}},
		{"member", &fsm.Member{ID: "n1", Incarnation: "3f2a9c", Removed: true}},
		{"member-key", &fsm.MemberKey{ID: "n2", Key: fsm.GrantKey(h("grant"))}},
		{"cluster-id", &fsm.ClusterID{ID: "c-0123456789abcdef"}},
		{"seal-check", &fsm.SealCheck{Check: []byte("sealed check bytes")}},
		{"features", &fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC | fsm.FeatureRestoreBounds}},
		{"restore-chunk", &fsm.RestoreChunk{ID: "r1", Seq: 3, Data: data, CRC: fsm.ChunkCRC(data)}},
		{"restore-commit", &fsm.RestoreCommit{ID: "r1", Chunks: 4, Size: 1 << 20, SHA256: h("snap")}},
		{"restore-commit-bounded", &fsm.RestoreCommit{ID: "r1", Chunks: 4, Size: 1 << 20, SHA256: h("snap"), Quota: q, FenceFloor: 77}},
		{"restore-commit-fence", &fsm.RestoreCommit{ID: "r2", Chunks: 1, Size: 9, FenceFloor: 1}},
		{"acquire-group", &fsm.AcquireGroup{GroupID: "G1", Keys: []fsm.GroupKey{{LeaseID: "L5", Key: "a", Limit: 1}, {LeaseID: "L6", Key: "b", Limit: 200}},
			Holder: "bob", SessionID: "S1", SessionTokenHash: h("st"), TokenHash: h("gt"), TTLMS: 3000, TTLTicks: 3,
			Metadata: meta, IdemHash: h("gi"), Fingerprint: h("gf"), SealedToken: []byte("sealed"), WaitTicks: 4,
			LockDelayMS: 1000, LockDelayTicks: 1, WallMS: 12, Quota: q}},
		{"acquire-group-min", &fsm.AcquireGroup{GroupID: "G", Keys: []fsm.GroupKey{{LeaseID: "L", Key: "k"}}}},
		{"renew-group", &fsm.RenewGroup{GroupID: "G1", TokenHash: h("gt"), TTLMS: 4000, TTLTicks: 4, WallMS: 13}},
		{"release-group", &fsm.ReleaseGroup{GroupID: "G1", TokenHash: h("gt"), SessionTokenHash: h("st"), Reason: "bye", WallMS: 14}},
		{"tick-pruned", &fsm.Tick{Tick: 7, WallMS: 7000, PeriodMS: 1000, RetainTicks: 8, RetainMax: 3, ExpireMax: 129, PruneMax: 4096}},
	}
	var batch fsm.Batch
	for _, c := range cmds {
		switch c.c.Type() {
		case fsm.TypeRestoreChunk, fsm.TypeRestoreCommit, fsm.TypeRestoreCommitBounded:
		case fsm.TypeTickPruned: // newer than the batch's pin
		default:
			batch.Commands = append(batch.Commands, c.c)
		}
	}
	cmds = append(cmds, struct {
		name string
		c    fsm.Command
	}{"batch", &batch})
	return cmds
}

// pinEncodeErrors are commands that cannot be encoded.
func pinEncodeErrors() []fsm.Command {
	return []fsm.Command{
		nil,
		(*fsm.Acquire)(nil),
		(*fsm.Batch)(nil),
		&fsm.Batch{},
		&fsm.Batch{Commands: make([]fsm.Command, fsm.MaxBatch+1)},
		&fsm.Batch{Commands: []fsm.Command{nil}},
		&fsm.Batch{Commands: []fsm.Command{&fsm.Batch{}}},
		&fsm.Batch{Commands: []fsm.Command{&fsm.RestoreChunk{ID: "r"}}},
		&fsm.Batch{Commands: []fsm.Command{&fsm.CancelWait{}, &fsm.RestoreCommit{ID: "r", FenceFloor: 1}}},
		&fsm.Batch{Commands: []fsm.Command{&fsm.CancelWait{}, &fsm.Renew{Metadata: map[string]string{"a": "b"}}}},
		&fsm.Renew{Metadata: map[string]string{"a": "b"}},
		&fsm.SessionHeartbeat{Metadata: map[string]string{"a": "b"}},
		&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "a", Metadata: map[string]string{"a": "b"}}}},
		&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "a", SetMetadata: true}, {LeaseID: "b", Metadata: map[string]string{"a": "b"}}}},
		&fsm.AcquireGroup{GroupID: "g"},
		&fsm.AcquireGroup{GroupID: "g", Keys: make([]fsm.GroupKey, fsm.MaxGroupKeys+1)},
		&fsm.Acquire{Metadata: map[string]string{"a\xff": "1", "a\xfe": "2"}},
		&fsm.Acquire{Metadata: map[string]string{"a\xff": "1", "b": "2"}, Key: "k\xff"},
		&fsm.Tick{Tick: 1, PruneMax: 1},
	}
}

// pinSnapshotFSM is a state with a bit of everything: a cluster id, a
// seal check, features, members with keys, sessions, leases (bound,
// grouped, idempotent, ended), waiters (one a group) and lock-delays.
func pinSnapshotFSM(t *testing.T, seed uint64, n int) *fsm.FSM {
	t.Helper()
	g := newGen(seed, true)
	g.members, g.grantKeys, g.meta, g.groups, g.chunk = true, true, true, true, 2
	r := newReplica(t)
	index := uint64(0)
	apply := func(c fsm.Command) []fsm.Result {
		index++
		return r.apply(index, mustEncode(t, c))
	}
	for _, c := range []fsm.Command{
		&fsm.ClusterID{ID: "c-0123456789abcdef"},
		&fsm.SealCheck{Check: []byte("sealed check bytes")},
		&fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC | fsm.FeatureChunkedExpiry},
	} {
		apply(c)
	}
	for range n {
		g.granted(apply(g.entry()), r.notices)
	}
	return r.f
}

// pinDecode renders what Decode makes of b.
func pinDecode(b []byte) string {
	c, err := fsm.Decode(b)
	if err != nil {
		return "err " + err.Error()
	}
	e, err := fsm.Encode(c)
	if err != nil {
		return fmt.Sprintf("ok %T, encode: %v", c, err)
	}
	return fmt.Sprintf("ok %T %x", c, e)
}

// pinRestore renders what Restore makes of b.
func pinRestore(t *testing.T, b []byte) string {
	f := fsm.New()
	if err := f.Restore(bytes.NewReader(b)); err != nil {
		return "err " + err.Error()
	}
	return fmt.Sprintf("ok %x", sha256.Sum256(snapshotBytes(t, f)))
}

// corruptions calls fn with every proper prefix of b and copies of b with
// one byte xored with 0x01, 0x80 or 0xff.
func corruptions(b []byte, fn func(what string, m []byte)) {
	for i := range len(b) {
		fn(fmt.Sprintf("prefix %d", i), b[:i:i])
	}
	for i := range b {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			m := bytes.Clone(b)
			m[i] ^= x
			fn(fmt.Sprintf("byte %d ^ %#x", i, x), m)
		}
	}
}

func TestCodecPin(t *testing.T) {
	var pins, listing strings.Builder
	pin := func(name, value string) { fmt.Fprintf(&pins, "%s %s\n", name, value) }
	list := func(format string, args ...any) { fmt.Fprintf(&listing, format+"\n", args...) }

	// The bytes of every command, and what Decode makes of them, of
	// their prefixes, of corrupted copies and of them as older versions.
	for _, tc := range pinCommands() {
		b, err := fsm.Encode(tc.c)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		pin(tc.name, hex.EncodeToString(b))
		list("%s: %s", tc.name, pinDecode(b))
		corruptions(b, func(what string, m []byte) { list("%s %s: %s", tc.name, what, pinDecode(m)) })
		for _, v := range []byte{0, 1, 2, 3, 5} {
			m := bytes.Clone(b)
			m[0] = v
			list("%s version %d: %s", tc.name, v, pinDecode(m))
			if v == 2 || v == 3 {
				if c, err := fsm.Decode(m); err == nil {
					list("%s version %d decodes as %s", tc.name, v, jsonOf(t, c))
				}
			}
		}
	}
	for i, c := range pinEncodeErrors() {
		_, err := fsm.Encode(c)
		list("encode error %d (%T): %v", i, c, err)
	}

	// A snapshot in full, with what Restore makes of its corruptions.
	small := snapshotBytes(t, pinSnapshotFSM(t, 3, 40))
	pin("snapshot", hex.EncodeToString(small))
	list("snapshot: %s", pinRestore(t, small))
	corruptions(small, func(what string, m []byte) { list("snapshot %s: %s", what, pinRestore(t, m)) })

	// Snapshots whose headers stop at each of their optional fields.
	for i, cmds := range [][]fsm.Command{
		nil,
		{&fsm.Member{ID: "n1", Incarnation: "a"}},
		{&fsm.ClusterID{ID: "c-0123456789abcdef"}},
		{&fsm.SealCheck{Check: []byte("check")}},
		{&fsm.FeaturesCmd{Features: fsm.FeatureEntryCRC}},
		{&fsm.ClusterID{ID: "c-0123456789abcdef"}, &fsm.FeaturesCmd{Features: fsm.FeatureRestoreLog}},
		{&fsm.Member{ID: "n1", Incarnation: "a"}, &fsm.SealCheck{Check: []byte("check")}},
	} {
		r := newReplica(t)
		for j, c := range cmds {
			r.apply(uint64(j+1), mustEncode(t, c))
		}
		snap := snapshotBytes(t, r.f)
		pin(fmt.Sprintf("snapshot-header-%d", i), hex.EncodeToString(snap))
		corruptions(snap, func(what string, m []byte) { list("snapshot-header-%d %s: %s", i, what, pinRestore(t, m)) })
	}

	// Digests of longer random logs and of their snapshots as they grow.
	for seed := uint64(1); seed <= 3; seed++ {
		g := newGen(seed, true)
		g.members, g.grantKeys, g.meta, g.groups, g.chunk = true, true, true, true, seed-1
		r := newReplica(t)
		log := sha256.New()
		for i := range 600 {
			b := mustEncode(t, g.entry())
			fmt.Fprintf(log, "%d:%x\n", len(b), b)
			g.granted(r.apply(uint64(i+1), b), r.notices)
			if (i+1)%150 == 0 {
				snap := snapshotBytes(t, r.f)
				pin(fmt.Sprintf("snapshot-%d-%d", seed, i+1), fmt.Sprintf("%x", sha256.Sum256(snap)))
				list("snapshot-%d-%d restores: %s", seed, i+1, pinRestore(t, snap))
			}
		}
		pin(fmt.Sprintf("log-%d", seed), fmt.Sprintf("%x", log.Sum(nil)))
	}
	pin("listing", fmt.Sprintf("%x", sha256.Sum256([]byte(listing.String()))))

	if path := os.Getenv("PIN_DUMP"); path != "" {
		if err := os.WriteFile(path, []byte(listing.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if *updatePin {
		if err := os.WriteFile(pinFile, []byte(pins.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(pinFile)
	if err != nil {
		t.Fatalf("%v (run with -update-pin to create it)", err)
	}
	wantLines, gotLines := strings.Split(string(want), "\n"), strings.Split(pins.String(), "\n")
	if len(wantLines) != len(gotLines) {
		t.Errorf("%s: %d lines, the code gives %d", pinFile, len(wantLines), len(gotLines))
	}
	for i := range min(len(wantLines), len(gotLines)) {
		if wantLines[i] != gotLines[i] {
			t.Errorf("%s line %d:\nwant %s\n got %s", pinFile, i+1, wantLines[i], gotLines[i])
		}
	}
}
