package fsm_test

import (
	"bytes"
	"testing"

	"github.com/leasehold/leasehold/fsm"
)

// TestEntryChecksum: an entry with a checksum decodes to the same command
// as one without, and any single flipped bit anywhere in it (version,
// type, body or checksum) is refused; an unchecked entry with a flipped
// bit in a key decodes as another command, which is what the checksum
// is for.
func TestEntryChecksum(t *testing.T) {
	g := newGen(42, true)
	g.members, g.meta, g.groups = true, true, true
	for i := range 300 {
		c := g.entry()
		plain, err := fsm.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		checked, err := fsm.EncodeChecked(c)
		if err != nil {
			t.Fatal(err)
		}
		if checked[0] != fsm.VersionChecked || len(checked) != len(plain)+4 {
			t.Fatalf("entry %d: checked encoding %x", i, checked[:2])
		}
		a, err := fsm.Decode(plain)
		if err != nil {
			t.Fatal(err)
		}
		b, err := fsm.Decode(checked)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		ra, _ := fsm.Encode(a)
		rb, _ := fsm.Encode(b)
		if !bytes.Equal(ra, rb) {
			t.Fatalf("entry %d decodes differently with a checksum", i)
		}
		if i%10 != 0 {
			continue
		}
		for pos := range checked {
			for bit := range 8 {
				d := bytes.Clone(checked)
				d[pos] ^= 1 << bit
				if _, err := fsm.Decode(d); err == nil {
					t.Fatalf("entry %d: bit %d of byte %d flipped, and it still decoded", i, bit, pos)
				}
			}
		}
	}
	acq := &fsm.Acquire{LeaseID: "L1", Key: "cam/1", Holder: "h", Limit: 1, TTLMS: 1000, TTLTicks: 10}
	plain, _ := fsm.Encode(acq)
	i := bytes.Index(plain, []byte("cam/1"))
	plain[i+4] ^= 1
	if c, err := fsm.Decode(plain); err != nil || c.(*fsm.Acquire).Key != "cam/0" {
		t.Fatalf("unchecked entry with a flipped key: %v %+v", err, c)
	}
}
