package fsm_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// versionJSON is the version of log entries with JSON bodies, written before
// version 2.
const versionJSON = 1

// encodeV1 encodes c as the version-1 encoder did: JSON bodies, and a Batch
// as uvarint-length-prefixed version-1 entries.
func encodeV1(t testing.TB, c fsm.Command) []byte {
	t.Helper()
	if b, ok := c.(*fsm.Batch); ok {
		out := []byte{versionJSON, byte(fsm.TypeBatch)}
		for _, sub := range b.Commands {
			e := encodeV1(t, sub)
			out = binary.AppendUvarint(out, uint64(len(e)))
			out = append(out, e...)
		}
		return out
	}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatalf("marshal %T: %v", c, err)
	}
	return append([]byte{versionJSON, byte(c.Type())}, body...)
}

// v1Entries are version-1 entries as the version-1 encoder wrote them for
// sampleCommands (the batch is framed from them).
var v1Entries = []string{
	"\x01\x02" + `{"tick":1,"wall_ms":1700000000000,"period_ms":1000,"retain_ticks":3600}`,
	"\x01\x03" + `{"lease_id":"L1","key":"k","holder":"alice","limit":1,"token_hash":"f8f2f34f3edd894e9a3ac00c2d3a1120419b7e57c88ba8b57ba4061544e444da","ttl_ms":5000,"ttl_ticks":5,"metadata":{"owner":"alice","ünï":"cödé"},"idem_hash":"058b3671e1e727330746af0ae9881e003ab29a4864b798e7bfd43ed3408a3aab","fingerprint":"5f7edb7ab828d70ff28bf9e39fba16fd8d67633cbcc58974c706438cf269b20f","sealed_token":"AAEC+g==","wait_ticks":3,"lock_delay_ms":2000,"lock_delay_ticks":2,"wall_ms":1}`,
	"\x01\x03" + `{"lease_id":"L2","key":"k2","holder":"","limit":1,"session_id":"S1","session_token_hash":"65c34f77fa4a286828ed76aaac664aa7d15d48ab8703e6f7aef0acd47f52f9a7","token_hash":"de032e5559da1c6e8d4f4c0432c8b036c444a1dab9fbcc6af84357e825c812ff","wall_ms":1}`,
	"\x01\x04" + `{"lease_id":"L1","token_hash":"f8f2f34f3edd894e9a3ac00c2d3a1120419b7e57c88ba8b57ba4061544e444da","ttl_ms":9000,"ttl_ticks":9,"wall_ms":5}`,
	"\x01\x05" + `{"lease_id":"L2","session_token_hash":"65c34f77fa4a286828ed76aaac664aa7d15d48ab8703e6f7aef0acd47f52f9a7","reason":"done","wall_ms":6}`,
	"\x01\x06" + `{"lease_id":"L1","reason":"op","wall_ms":7}`,
	"\x01\x07" + `{"items":[{"lease_id":"L1","token_hash":"f8f2f34f3edd894e9a3ac00c2d3a1120419b7e57c88ba8b57ba4061544e444da"}],"wall_ms":8}`,
	"\x01\x08" + `{"session_id":"S1","holder":"alice","token_hash":"65c34f77fa4a286828ed76aaac664aa7d15d48ab8703e6f7aef0acd47f52f9a7","ttl_ms":10000,"ttl_ticks":10,"wall_ms":4}`,
	"\x01\x09" + `{"session_id":"S1","token_hash":"65c34f77fa4a286828ed76aaac664aa7d15d48ab8703e6f7aef0acd47f52f9a7","wall_ms":9}`,
	"\x01\x0a" + `{"session_id":"S1","force":true,"wall_ms":10}`,
	"\x01\x0b" + `{"holder":"alice","reason":"restart","wall_ms":11}`,
	"\x01\x0c" + `{"lease_id":"L1","key":"k"}`,
	"\x01\x0d" + `{"id":"n1","incarnation":"3f2a9c","removed":true}`,
}

// TestDecodeVersion1: entries of the JSON era still decode, to the same
// commands, which then encode as version 2.
func TestDecodeVersion1(t *testing.T) {
	want := sampleCommands()
	batch := []byte{versionJSON, byte(fsm.TypeBatch)}
	for _, e := range v1Entries {
		batch = binary.AppendUvarint(batch, uint64(len(e)))
		batch = append(batch, e...)
	}
	entries := append(append([]string(nil), v1Entries...), string(batch))
	if len(entries) != len(want) {
		t.Fatalf("%d version-1 entries for %d sample commands", len(entries), len(want))
	}
	for i, e := range entries {
		c, err := fsm.Decode([]byte(e))
		if err != nil {
			t.Fatalf("decode %q: %v", e, err)
		}
		if !reflect.DeepEqual(c, want[i]) {
			t.Fatalf("version-1 entry %d:\n got %#v\nwant %#v", i, c, want[i])
		}
		if got := mustEncode(t, c); got[0] != fsm.Version || !bytes.Equal(got, mustEncode(t, want[i])) {
			t.Fatalf("version-1 entry %d re-encodes as % x", i, got)
		}
		// The helper agrees with what is on disk.
		if got := encodeV1(t, want[i]); string(got) != e {
			t.Fatalf("encodeV1 of %T:\n got %q\nwant %q", want[i], got, e)
		}
	}

	// Empty maps and slices of a JSON body come back nil, as in version 2.
	c, err := fsm.Decode([]byte("\x01\x03" + `{"metadata":{},"sealed_token":""}`))
	if err != nil {
		t.Fatal(err)
	}
	if a := c.(*fsm.Acquire); a.Metadata != nil || a.SealedToken != nil {
		t.Errorf("empty JSON fields decode as %#v, %#v", a.Metadata, a.SealedToken)
	}
	c, err = fsm.Decode([]byte("\x01\x07" + `{"items":[],"wall_ms":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.(*fsm.Heartbeat); h.Items != nil {
		t.Errorf("empty JSON items decode as %#v", h.Items)
	}

	// Versions do not mix within a batch.
	v2 := mustEncode(t, &fsm.CancelWait{LeaseID: "x", Key: "k"})
	mixed := append([]byte{versionJSON, byte(fsm.TypeBatch), byte(len(v2))}, v2...)
	if c, err := fsm.Decode(mixed); err == nil {
		t.Errorf("Decode accepted a version-2 entry in a version-1 batch: %#v", c)
	}
}

// TestEncodingGolden pins the version-4 format: field order, varints,
// zigzag, hashes, bools, sorted maps, batch framing, the Quota after the
// bodies of Acquire and SessionCreate and the RetainMax of Tick.
func TestEncodingGolden(t *testing.T) {
	for _, tc := range goldenCommands() {
		got := hex.EncodeToString(mustEncode(t, tc.c))
		want := "04" + tc.hex[2:] + tc.quota + tc.v4
		if tc.full4 != "" {
			want = tc.full4
		}
		if got != want {
			t.Errorf("%T:\n got %s\nwant %s", tc.c, got, want)
		}
	}
	// The version-4 fields, set.
	for _, tc := range []struct {
		c    fsm.Command
		tail string
	}{
		{&fsm.Tick{Tick: 1, RetainMax: 300}, "ac02"},
		{&fsm.Acquire{Quota: fsm.Quota{KeyWaiters: 300, HolderWaiters: 2}}, "ac02" + "02"},
	} {
		if got := hex.EncodeToString(mustEncode(t, tc.c)); !strings.HasSuffix(got, tc.tail) {
			t.Errorf("%T: %s does not end in %s", tc.c, got, tc.tail)
		}
	}
}

// TestDecodeVersion3: version-3 entries (no waiter limits, no RetainMax)
// still decode, to the same commands with those fields zero.
func TestDecodeVersion3(t *testing.T) {
	for _, tc := range goldenCommands() {
		if _, ok := tc.c.(*fsm.Batch); ok {
			continue
		}
		b, err := hex.DecodeString("03" + tc.hex[2:] + tc.quota)
		if err != nil {
			t.Fatal(err)
		}
		c, err := fsm.Decode(b)
		if err != nil {
			t.Fatalf("%T: version 3 % x: %v", tc.c, b, err)
		}
		if !reflect.DeepEqual(c, tc.c) {
			t.Errorf("version 3 % x:\n got %#v\nwant %#v", b, c, tc.c)
		}
		if tc.v4 != "" {
			if c, err := fsm.Decode(append(b, 0, 0)); err == nil {
				t.Errorf("version 3 with version-4 fields decoded as %#v", c)
			}
		}
	}
	b, _ := hex.DecodeString("030102020501d00fac020c024c31016b")
	if _, err := fsm.Decode(b); err != nil {
		t.Errorf("version-3 batch: %v", err)
	}
}

// TestDecodeVersion2: version-2 entries (no Quota) still decode, to the
// same commands with a zero Quota.
func TestDecodeVersion2(t *testing.T) {
	for _, tc := range goldenCommands() {
		b, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		c, err := fsm.Decode(b)
		if err != nil {
			t.Fatalf("%T: version 2 % x: %v", tc.c, b, err)
		}
		want := tc.c
		switch w := tc.c.(type) {
		case *fsm.Acquire:
			cp := *w
			cp.Quota = fsm.Quota{}
			want = &cp
		case *fsm.SessionCreate:
			cp := *w
			cp.Quota = fsm.Quota{}
			want = &cp
		}
		if !reflect.DeepEqual(c, want) {
			t.Errorf("version 2 % x:\n got %#v\nwant %#v", b, c, want)
		}
		// Version 2 bodies end where they did: a Quota after them is
		// trailing data.
		if tc.quota != "" {
			if c, err := fsm.Decode(append(b, 0, 0, 0, 0)); err == nil {
				t.Errorf("version 2 with a quota decoded as %#v", c)
			}
		}
	}
}

type golden struct {
	c     fsm.Command
	hex   string // the version-2 encoding
	quota string // what version 3 adds at the end
	v4    string // what version 4 adds at the end (waiter limits, RetainMax)
	full4 string // the whole version-4 encoding, when not the above
}

func goldenCommands() []golden {
	zero := strings.Repeat("00", 32)
	tick := &fsm.Tick{Tick: 5, WallMS: -1, PeriodMS: 1000, RetainTicks: 300}
	cancel := &fsm.CancelWait{LeaseID: "L1", Key: "k"}
	return []golden{
		{tick, "0202" + "05" + "01" + "d00f" + "ac02", "", "00", ""},
		{cancel, "020c" + "024c31" + "016b", "", "", ""},
		{&fsm.SessionEnd{SessionID: "S", Force: true, WallMS: 3}, "020a" + "0153" + zero + "01" + "06", "", "", ""},
		{&fsm.SessionCreate{SessionID: "S", Holder: "h", TokenHash: fsm.Hash{0: 0xab}, Metadata: map[string]string{"b": "2", "a": "1"}},
			"0208" + "0153" + "0168" + "ab" + strings.Repeat("00", 31) + "00" + "00" + "02" + "0161" + "0131" + "0162" + "0132" + "00", "00000000", "0000", ""},
		{&fsm.SessionCreate{SessionID: "S", Holder: "h", Quota: fsm.Quota{Sessions: 300, HolderSessions: 2}},
			"0208" + "0153" + "0168" + zero + "00" + "00" + "00" + "00", "00" + "00" + "ac02" + "02", "0000", ""},
		{&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: "a"}}, WallMS: 64}, "0207" + "01" + "0161" + zero + "8001", "", "", ""},
		{&fsm.Acquire{LeaseID: "L", Key: "k", Holder: "h", Limit: 300, SealedToken: []byte{9}, WallMS: 2},
			"0203" + "014c" + "016b" + "0168" + "ac02" + "00" + zero + zero + "00" + "00" + "00" + zero + zero + "0109" + "00" + "00" + "00" + "04", "00000000", "0000", ""},
		{&fsm.Acquire{LeaseID: "L", Key: "k", Holder: "h", Limit: 1, Quota: fsm.Quota{Leases: 1000, HolderLeases: 5}},
			"0203" + "014c" + "016b" + "0168" + "01" + "00" + zero + zero + "00" + "00" + "00" + zero + zero + "00" + "00" + "00" + "00" + "00", "e807" + "05" + "00" + "00", "0000", ""},
		{&fsm.Member{ID: "n1", Incarnation: "ab", Removed: true}, "020d" + "026e31" + "026162" + "01", "", "", ""},
		{&fsm.Member{ID: "n1"}, "020d" + "026e31" + "00" + "00", "", "", ""},
		{&fsm.Batch{Commands: []fsm.Command{tick, cancel}}, "0201" + "02" + "02" + "0501d00fac02" + "0c" + "024c31016b", "", "",
			"0401" + "02" + "02" + "0501d00fac0200" + "0c" + "024c31016b"},
	}
}

// TestDecodeTruncated: every proper prefix of a valid encoding, of every
// command type and of a batch, is rejected (and nothing panics).
func TestDecodeTruncated(t *testing.T) {
	for _, c := range sampleCommands() {
		b := mustEncode(t, c)
		for i := range len(b) {
			if d, err := fsm.Decode(b[:i:i]); err == nil || d != nil {
				t.Errorf("%T: prefix of %d of %d bytes decoded as %#v (err %v)", c, i, len(b), d, err)
			}
		}
	}
}

// TestDecodeCanonical: a corrupted byte anywhere in a valid encoding either
// is rejected or yields a command whose encoding is exactly the input, so no
// command has two encodings.
func TestDecodeCanonical(t *testing.T) {
	for _, c := range sampleCommands() {
		b := mustEncode(t, c)
		for i := range b {
			for _, x := range []byte{0x01, 0x80, 0xff} {
				m := bytes.Clone(b)
				m[i] ^= x
				d, err := fsm.Decode(m)
				if err != nil || m[0] != fsm.Version {
					continue
				}
				if e := mustEncode(t, d); !bytes.Equal(e, m) {
					t.Errorf("%T with byte %d ^ %#x: decodes, but encodes as\n% x\nnot\n% x", c, i, x, e, m)
				}
			}
		}
	}
}

// TestDecodeRejects: version-3 inputs that are not the one encoding of a
// command.
func TestDecodeRejects(t *testing.T) {
	v := fsm.Version
	cancel := mustEncode(t, &fsm.CancelWait{LeaseID: "x", Key: "k"}) // 02 0c 01 78 01 6b
	acquire := mustEncode(t, &fsm.Acquire{LeaseID: "L", Key: "k", Holder: "h", Limit: 1})
	end := mustEncode(t, &fsm.SessionEnd{SessionID: "s", Force: true})
	member := mustEncode(t, &fsm.Member{ID: "n1", Incarnation: "i", Removed: true})
	meta := mustEncode(t, &fsm.SessionCreate{SessionID: "s", Metadata: map[string]string{"a": "1", "b": "2"}})
	sorted := []byte{2, 1, 'a', 1, '1', 1, 'b', 1, '2'}
	replace := func(b, old, new []byte) []byte {
		t.Helper()
		if bytes.Count(b, old) != 1 {
			t.Fatalf("% x not once in % x", old, b)
		}
		return bytes.Replace(b, old, new, 1)
	}
	splice := func(b []byte, at, n int, with ...byte) []byte {
		return append(append(bytes.Clone(b[:at]), with...), b[at+n:]...)
	}
	bad := map[string][]byte{
		"trailing byte":       append(bytes.Clone(cancel), 0),
		"non-minimal length":  splice(cancel, 2, 1, 0x81, 0x00),
		"overlong varint":     splice(cancel, 2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		"length past end":     splice(cancel, 2, 1, 0xff, 0xff, 0xff, 0xff, 0x0f),
		"invalid UTF-8":       splice(cancel, 3, 1, 0xff),
		"bool 2":              splice(end, len(end)-2, 1, 2),
		"member bool 2":       splice(member, len(member)-1, 1, 2),
		"member bool 0x80":    splice(member, len(member)-1, 1, 0x80),
		"member no bool":      member[:len(member)-1],
		"member trailing":     append(bytes.Clone(member), 0),
		"member bad UTF-8":    splice(member, 3, 1, 0xff),
		"limit over 32 bits":  splice(acquire, 8, 1, 0x80, 0x80, 0x80, 0x80, 0x10),
		"unsorted map keys":   replace(meta, sorted, []byte{2, 1, 'b', 1, '2', 1, 'a', 1, '1'}),
		"duplicate map keys":  replace(meta, sorted, []byte{2, 1, 'a', 1, '1', 1, 'a', 1, '2'}),
		"map count past end":  replace(meta, sorted, []byte{0xff, 0xff, 0x03}),
		"items past end":      {v, byte(fsm.TypeHeartbeat), 0xff, 0xff, 0xff, 0xff, 0x0f, 0},
		"batch count 0":       {v, byte(fsm.TypeBatch), 0},
		"batch count too big": append([]byte{v, byte(fsm.TypeBatch), 2}, cancel[1:]...),
		"batch short":         append([]byte{v, byte(fsm.TypeBatch), 1}, cancel[1:len(cancel)-1]...),
		"batch trailing":      append(append([]byte{v, byte(fsm.TypeBatch), 1}, cancel[1:]...), 0),
		"batch sub type 0":    {v, byte(fsm.TypeBatch), 1, 0},
		"batch in batch":      append([]byte{v, byte(fsm.TypeBatch), 1, byte(fsm.TypeBatch), 1}, cancel[1:]...),
		"version-1 framing":   append([]byte{v, byte(fsm.TypeBatch), byte(len(cancel))}, cancel...),
	}
	for name, b := range bad {
		if c, err := fsm.Decode(b); err == nil || c != nil {
			t.Errorf("%s: Decode accepted % x as %#v", name, b, c)
		}
	}
	// The splices above are right: undone, they decode.
	if _, err := fsm.Decode(splice(end, len(end)-2, 1, 0)); err != nil {
		t.Errorf("force=false: %v", err)
	}
	if c, err := fsm.Decode(splice(member, len(member)-1, 1, 0)); err != nil || c.(*fsm.Member).Removed {
		t.Errorf("removed=false: %#v, %v", c, err)
	}
	if _, err := fsm.Decode(splice(acquire, 8, 1, 0x80, 0x80, 0x80, 0x80, 0x0f)); err != nil {
		t.Errorf("limit 2^32-1: %v", err)
	}
}

// TestEncodeInvalidUTF8: strings that are not valid UTF-8 are written as the
// JSON encoding wrote them, each bad byte as U+FFFD, so that what Encode
// writes always decodes.
func TestEncodeInvalidUTF8(t *testing.T) {
	c := &fsm.Acquire{LeaseID: "a\xffb", Key: "\xe2\x82", Holder: "ok\u00e9",
		Metadata: map[string]string{"k\xfe": "v\xfd", "k": "v"}}
	d, err := fsm.Decode(mustEncode(t, c))
	if err != nil {
		t.Fatal(err)
	}
	j, err := fsm.Decode(encodeV1(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d, j) {
		t.Fatalf("binary and JSON disagree:\n%#v\n%#v", d, j)
	}
	if a := d.(*fsm.Acquire); a.LeaseID != "a\uFFFDb" || a.Key != "\uFFFD\uFFFD" || a.Metadata["k\uFFFD"] != "v\uFFFD" {
		t.Fatalf("decoded %#v", a)
	}
	// Keys that become equal cannot both be kept.
	if _, err := fsm.Encode(&fsm.SessionCreate{Metadata: map[string]string{"\xff": "1", "\xfe": "2"}}); err == nil {
		t.Error("Encode accepted metadata keys that collide")
	}
}

func TestEncodeRefuses(t *testing.T) {
	for _, c := range []fsm.Command{nil, (*fsm.Tick)(nil), (*fsm.Batch)(nil),
		&fsm.Batch{Commands: []fsm.Command{(*fsm.Acquire)(nil)}}, &fsm.Batch{Commands: []fsm.Command{nil}}} {
		if b, err := fsm.Encode(c); err == nil {
			t.Errorf("Encode(%#v) = % x", c, b)
		}
	}
}

// benchAcquires are Acquire shapes of the hot path: a plain standalone
// acquire, and one with metadata, an idempotency key and a sealed token.
func benchAcquires() map[string]*fsm.Acquire {
	plain := acq("01HZX3V6T8K4M2N9P7Q5R1S0AB", "jobs/nightly-report", "worker-17.example.internal", 30)
	plain.WallMS = 1700000000123
	full := withIdem(withWait(acq("01HZX3V6T8K4M2N9P7Q5R1S0CD", "jobs/nightly-report", "worker-17.example.internal", 30), 5), "op", "fp")
	full.WallMS = 1700000000123
	full.Metadata = map[string]string{"owner": "alice", "purpose": "nightly report"}
	full.SealedToken = make([]byte, 60)
	return map[string]*fsm.Acquire{"plain": plain, "full": full}
}

// BenchmarkEncodeDecodeAcquire: one Encode and one Decode, of version 2
// (binary), and of version 1 (JSON: json.Marshal as the old Encode did, and
// the JSON path of Decode) for comparison.
func BenchmarkEncodeDecodeAcquire(b *testing.B) {
	for _, name := range []string{"plain", "full"} {
		c := benchAcquires()[name]
		b.Run("binary/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				e, err := fsm.Encode(c)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := fsm.Decode(e); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(mustEncode(b, c))), "bytes/entry")
		})
		b.Run("json/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				body, err := json.Marshal(c)
				if err != nil {
					b.Fatal(err)
				}
				e := make([]byte, 0, 2+len(body))
				e = append(append(e, versionJSON, byte(fsm.TypeAcquire)), body...)
				if _, err := fsm.Decode(e); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(encodeV1(b, c))), "bytes/entry")
		})
	}
}

// BenchmarkEncodeDecodeBatch: a group-commit entry of 64 hot-path commands.
func BenchmarkEncodeDecodeBatch(b *testing.B) {
	batch := &fsm.Batch{}
	for i := range 16 {
		id := "01HZX3V6T8K4M2N9P7Q5R1S0" + string(rune('A'+i))
		batch.Commands = append(batch.Commands,
			benchAcquires()["plain"],
			&fsm.Renew{LeaseID: id, TokenHash: tok(id), WallMS: 1700000000123},
			&fsm.Release{LeaseID: id, TokenHash: tok(id), WallMS: 1700000000123},
			&fsm.Heartbeat{Items: []fsm.HeartbeatItem{{LeaseID: id, TokenHash: tok(id)}, {LeaseID: id + "x", TokenHash: tok(id)}}, WallMS: 1700000000123},
		)
	}
	b.ReportAllocs()
	for b.Loop() {
		e, err := fsm.Encode(batch)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := fsm.Decode(e); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(mustEncode(b, batch))), "bytes/entry")
}

// TestDecodeUnknownType: a checked entry (its checksum holds), or a
// command in its batch, whose type is after every type this release knows
// was written by a newer release: Decode wraps ErrUnknownType. Damage does
// not: a type never used, a type in a version that never carries it, a
// checksum that does not match, or an unknown type in an entry without a
// checksum (a flipped type byte reads just like it; newer releases write
// new types only once every server reads checksums).
func TestDecodeUnknownType(t *testing.T) {
	v := fsm.Version
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	checked := func(b []byte) []byte {
		b = bytes.Clone(b)
		b[0] = fsm.VersionChecked
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	cancel := mustEncode(t, &fsm.CancelWait{LeaseID: "x", Key: "k"})
	newer := []byte{v, 0xff, 1, 'x'}
	newerBatch := append(append([]byte{v, byte(fsm.TypeBatch), 2}, cancel[1:]...), 0xff, 1, 'x')
	// newerVersion: an entry of a version after VersionChecked, with the
	// checksum every later version ends with.
	newerVersion := func(version byte, b []byte) []byte {
		b = bytes.Clone(b)
		b[0] = version
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	for name, b := range map[string][]byte{
		"unknown type":          checked(newer),
		"unknown type in batch": checked(newerBatch),
		"newer version":         newerVersion(fsm.VersionChecked+1, cancel),
		"newest version":        newerVersion(0xff, newer),
	} {
		if c, err := fsm.Decode(b); c != nil || !errors.Is(err, fsm.ErrUnknownType) {
			t.Errorf("%s: %#v, %v; want ErrUnknownType", name, c, err)
		}
	}
	rotten := checked(newer)
	rotten[2] ^= 1
	flipped := checked(cancel)
	flipped[0]++ // a checked entry whose version byte flipped: its checksum covers it
	for name, b := range map[string][]byte{
		"unchecked unknown type":  newer,
		"unchecked, in batch":     newerBatch,
		"type 0":                  checked([]byte{v, 0, 1, 'x'}),
		"batch sub type 0":        checked([]byte{v, byte(fsm.TypeBatch), 1, 0}),
		"version 2, unknown type": {2, 0xff, 1, 'x'},
		"version 2, pruned tick":  {2, byte(fsm.TypeTickPruned), 1, 1, 1, 1, 1, 1},
		"checksum mismatch":       rotten,
		"version byte flipped":    flipped,
		"newer version, short":    {fsm.VersionChecked + 1, 1, 0, 0, 0},
		"truncated":               checked(cancel[:len(cancel)-1]),
	} {
		if c, err := fsm.Decode(b); c != nil || err == nil || errors.Is(err, fsm.ErrUnknownType) {
			t.Errorf("%s: %#v, %v; want an error that is not ErrUnknownType", name, c, err)
		}
	}
}

// TestVerifyChecksumVersionByte: a checked entry whose version byte rots
// upwards (a version this release does not know, or a later one) fails
// the checksum check that the leader's log check runs before it sends an
// entry; an entry of a later version whose checksum holds passes it.
func TestVerifyChecksumVersionByte(t *testing.T) {
	b, err := fsm.EncodeChecked(&fsm.CancelWait{LeaseID: "x", Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	caught := 0
	for bit := range 8 {
		rot := bytes.Clone(b)
		rot[0] ^= 1 << bit
		if rot[0] < fsm.VersionChecked {
			continue // an earlier version: it carries no checksum to tell
		}
		if err := fsm.VerifyChecksum(rot); !errors.Is(err, fsm.ErrChecksum) {
			t.Errorf("version byte %d -> %d: %v, want ErrChecksum", b[0], rot[0], err)
		}
		caught++
	}
	if caught != 6 {
		t.Errorf("%d flips to a version >= %d, want 6", caught, fsm.VersionChecked)
	}
	later := bytes.Clone(b[:len(b)-4])
	later[0] = fsm.VersionChecked + 1
	later = binary.LittleEndian.AppendUint32(later, crc32.Checksum(later, crc32.MakeTable(crc32.Castagnoli)))
	if err := fsm.VerifyChecksum(later); err != nil {
		t.Errorf("a later version whose checksum holds: %v", err)
	}
}
