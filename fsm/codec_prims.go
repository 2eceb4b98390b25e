package fsm

// The primitives of the version-2 log encoding (codec.go): the encoder
// and decoder of integers, strings, byte slices, hashes, bools and maps.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"
)

// enc appends a version-2 encoding to b. The first error is kept in err.
type enc struct {
	b   []byte
	err error
}

func (e *enc) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }

// varint writes v zigzag-encoded.
func (e *enc) varint(v int64) { e.b = binary.AppendVarint(e.b, v) }

// str writes s, with any byte that is not valid UTF-8 replaced by U+FFFD as
// the JSON encoding of version 1 did: a string decodes only if it is valid.
func (e *enc) str(s string) {
	if !utf8.ValidString(s) {
		s = toValidUTF8(s)
	}
	e.uvarint(uint64(len(s)))
	e.b = append(e.b, s...)
}

func (e *enc) bytes(p []byte) {
	e.uvarint(uint64(len(p)))
	e.b = append(e.b, p...)
}

func (e *enc) hash(h Hash) { e.b = append(e.b, h[:]...) }

func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}

// strmap writes the count of m and its entries sorted by key.
func (e *enc) strmap(m map[string]string) {
	var arr [MaxMetaEntries]string
	keys, valid := arr[:0], true
	for k := range m {
		keys = append(keys, k)
		valid = valid && utf8.ValidString(k)
	}
	if !valid {
		// Keys are made valid UTF-8 (as str does) before sorting, so they
		// must still be distinct afterwards.
		fixed := make(map[string]string, len(m))
		for k, v := range m {
			fixed[toValidUTF8(k)] = v
		}
		if len(fixed) != len(m) {
			e.fail(errors.New("fsm: map keys collide once made valid UTF-8"))
			return
		}
		e.strmap(fixed)
		return
	}
	slices.Sort(keys)
	e.uvarint(uint64(len(keys)))
	for _, k := range keys {
		e.str(k)
		e.str(m[k])
	}
}

// dec reads a version-2 encoding from b. The first error is kept in err;
// after it every read returns a zero value.
type dec struct {
	b       []byte // what is left to read
	size    int    // length of the whole input, for error offsets
	version byte   // of the entry: version 2 commands carry no Quota
	err     error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s at byte %d", what, d.size-len(d.b))
	}
	d.b = nil
}

// take returns the next n bytes (n <= len(d.b) is checked).
func (d *dec) take(n int) []byte {
	if n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// uvarint reads a uvarint in its shortest form.
func (d *dec) uvarint() uint64 {
	v, w := binary.Uvarint(d.b)
	switch {
	case w == 0:
		d.fail("truncated")
		return 0
	case w < 0:
		d.fail("varint overflows 64 bits")
		return 0
	case w > 1 && d.b[w-1] == 0:
		d.fail("varint not in its shortest form")
		return 0
	}
	d.b = d.b[w:]
	return v
}

// varint reads a zigzag-encoded varint.
func (d *dec) varint() int64 {
	u := d.uvarint()
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

func (d *dec) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("value overflows 32 bits")
		return 0
	}
	return uint32(v)
}

// count reads a number of items of at least minSize bytes each, which must
// fit in what is left.
func (d *dec) count(minSize int) int {
	n := d.uvarint()
	if n > uint64(len(d.b)/minSize) {
		d.fail(fmt.Sprintf("count %d is more than the rest of the input holds", n))
		return 0
	}
	return int(n)
}

func (d *dec) str() string { return string(d.strBytes()) }

// strPair reads two strings into one allocation (a lease's id and key live
// as long as each other: one allocation of 48 bytes instead of 24 and 32).
func (d *dec) strPair() (string, string) {
	a, b := d.strBytes(), d.strBytes()
	var arr [96]byte
	s := string(append(append(arr[:0], a...), b...))
	return s[:len(a)], s[len(a):]
}

// strBytes reads a string without copying it: the bytes are the input's.
func (d *dec) strBytes() []byte {
	n := d.count(1)
	p := d.take(n)
	if !utf8.Valid(p) {
		d.fail("string is not valid UTF-8")
		return nil
	}
	return p
}

// bytes reads a byte slice; empty is nil.
func (d *dec) bytes() []byte {
	n := d.count(1)
	if n == 0 {
		return nil
	}
	return slices.Clone(d.take(n))
}

func (d *dec) hash() (h Hash) {
	copy(h[:], d.take(len(h)))
	return h
}

func (d *dec) bool() bool {
	switch p := d.take(1); {
	case p == nil:
		return false
	case p[0] > 1:
		d.fail(fmt.Sprintf("bool byte %d", p[0]))
		return false
	default:
		return p[0] == 1
	}
}

// strmap reads a map written by enc.strmap; empty is nil.
func (d *dec) strmap() map[string]string {
	n := d.count(2) // an entry is at least two empty strings
	if n == 0 {
		return nil
	}
	m := make(map[string]string, n)
	prev := ""
	for i := range n {
		k, v := d.str(), d.str()
		if d.err != nil {
			return nil
		}
		if i > 0 && k <= prev {
			d.fail("map keys not in strictly increasing order")
			return nil
		}
		m[k], prev = v, k
	}
	return m
}
