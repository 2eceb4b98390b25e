package wire

// The keep-alive stream's lines (KeepAliveRenewal one way, KeepAliveAnswer
// the other) are flat JSON objects: the server (package api) and the Go
// client (package api/client) write and read the usual ones without
// reflection, each falling back to encoding/json for anything else. What
// they share is here.

// PlainJSONString reports whether s is printable ASCII that encoding/json
// writes as is, between quotes (no '"', '\\', '<', '>', '&').
func PlainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// ScanFlatLine reads line as one JSON object of the plain form the
// keep-alive stream's usual lines take: '{', "key":value pairs separated by
// ',', '}' ending the line, no white space, keys of printable ASCII without
// escapes. field is called with each key (valid only during the call) and
// the value, which it reads with one of FlatValue's methods; it returns
// false to refuse the line (an unknown or repeated key, a value of another
// form). ScanFlatLine reports whether the whole line was read; false
// leaves the line to encoding/json, so that the caller must not keep what
// field set.
func ScanFlatLine(line []byte, field func(key []byte, v *FlatValue) bool) bool {
	v := FlatValue{line: line}
	if !v.next('{') {
		return false
	}
	for {
		key, ok := v.raw()
		if !ok || !v.next(':') || !field(key, &v) {
			return false
		}
		if v.next('}') {
			return v.i == len(line)
		}
		if !v.next(',') {
			return false
		}
	}
}

// FlatValue is the value of one field of a line ScanFlatLine reads.
type FlatValue struct {
	line []byte
	i    int
}

func (v *FlatValue) next(c byte) bool {
	if v.i < len(v.line) && v.line[v.i] == c {
		v.i++
		return true
	}
	return false
}

// raw reads a string of printable ASCII other than '"' and '\\' (no escape),
// returned as the bytes of the line.
func (v *FlatValue) raw() ([]byte, bool) {
	if !v.next('"') {
		return nil, false
	}
	start := v.i
	for ; v.i < len(v.line); v.i++ {
		c := v.line[v.i]
		if c == '"' {
			s := v.line[start:v.i]
			v.i++
			return s, true
		}
		if c < 0x20 || c > 0x7e || c == '\\' {
			return nil, false
		}
	}
	return nil, false
}

// String reads a string of printable ASCII without escapes.
func (v *FlatValue) String() (string, bool) {
	b, ok := v.raw()
	return string(b), ok
}

// Uint reads a plain non-negative integer (no sign, no leading zero, no
// fraction or exponent) of at most 18 digits: one that encoding/json reads
// into any integer field wide enough, alike.
func (v *FlatValue) Uint() (uint64, bool) {
	start := v.i
	var n uint64
	for ; v.i < len(v.line) && v.line[v.i] >= '0' && v.line[v.i] <= '9'; v.i++ {
		n = n*10 + uint64(v.line[v.i]-'0')
	}
	d := v.i - start
	if d == 0 || d > 18 || (d > 1 && v.line[start] == '0') {
		return 0, false
	}
	return n, true
}

// Bool reads true or false.
func (v *FlatValue) Bool() (val, ok bool) {
	rest := v.line[v.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		v.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		v.i += 5
		return false, true
	}
	return false, false
}
