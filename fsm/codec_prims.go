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

// uint32 is a uvarint (dec.uint32 checks it fits).
func (e *enc) uint32(v uint32) { e.uvarint(uint64(v)) }

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

// failWith fails the decoding with err (wrapped, so that errors.Is sees
// it) and the offset.
func (d *dec) failWith(err error) {
	if d.err == nil {
		d.err = fmt.Errorf("%w at byte %d", err, d.size-len(d.b))
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

// fields writes (e set) or reads (d set) the fields of a body or record:
// each lists its fields once, in one method that serves both directions,
// so that the two cannot drift apart. Exactly one of e and d is set.
type fields struct {
	e *enc
	d *dec
}

// field writes *p with put or reads it with get.
func field[T any](f fields, p *T, put func(*enc, T), get func(*dec) T) {
	if f.e != nil {
		put(f.e, *p)
	} else {
		*p = get(f.d)
	}
}

func (f fields) uvarint(p *uint64)           { field(f, p, (*enc).uvarint, (*dec).uvarint) }
func (f fields) varint(p *int64)             { field(f, p, (*enc).varint, (*dec).varint) }
func (f fields) uint32(p *uint32)            { field(f, p, (*enc).uint32, (*dec).uint32) }
func (f fields) str(p *string)               { field(f, p, (*enc).str, (*dec).str) }
func (f fields) hash(p *Hash)                { field(f, p, (*enc).hash, (*dec).hash) }
func (f fields) bool(p *bool)                { field(f, p, (*enc).bool, (*dec).bool) }
func (f fields) bytes(p *[]byte)             { field(f, p, (*enc).bytes, (*dec).bytes) }
func (f fields) strmap(p *map[string]string) { field(f, p, (*enc).strmap, (*dec).strmap) }

// strPair is two strings, read into one allocation (dec.strPair).
func (f fields) strPair(a, b *string) {
	if f.e != nil {
		f.e.str(*a)
		f.e.str(*b)
	} else {
		*a, *b = f.d.strPair()
	}
}

// typ is a command's type byte (in a Batch).
func (f fields) typ(p *Type) {
	if f.e != nil {
		f.e.b = append(f.e.b, byte(*p))
	} else if b := f.d.take(1); b != nil {
		*p = Type(b[0])
	}
}

// count writes n, or reads a count of items of at least minSize bytes.
func (f fields) count(n, minSize int) int {
	if f.e != nil {
		f.e.uvarint(uint64(n))
		return n
	}
	return f.d.count(minSize)
}

// list writes or reads the count of *s and then each item with fn; a
// list read empty is nil.
func list[T any](f fields, s *[]T, minSize int, fn func(*T)) {
	if n := f.count(len(*s), minSize); f.d != nil && n > 0 {
		*s = make([]T, n)
	}
	for i := range *s {
		fn(&(*s)[i])
	}
}

// since reports whether the entry has the fields that came with version
// v: an encoding always has them (it is of Version).
func (f fields) since(v byte) bool { return f.e != nil || f.d.version >= v }

// reject fails a decoding, if nothing failed it before, when bad: what a
// reader must refuse (a value with another encoding, or none).
func (f fields) reject(bad bool, what string) {
	if f.d != nil && f.d.err == nil && bad {
		f.d.fail(what)
	}
}

// fail fails an encoding (with the error "fsm: what") or a decoding.
func (f fields) fail(what string) {
	if f.e != nil {
		f.e.fail(errors.New("fsm: " + what))
	} else {
		f.d.fail(what)
	}
}

// refuse fails an encoding: what has no encoding.
func (f fields) refuse(err error) {
	if f.e != nil {
		f.e.fail(err)
	}
}
