package wire

import "testing"

// TestScanFlatLine: the plain lines are read field by field, with their
// values; anything else (white space, escapes, a missing brace, bytes
// after the object, a value of another form) is refused.
func TestScanFlatLine(t *testing.T) {
	type got struct {
		id     uint64
		s      string
		ok     bool
		fields int
	}
	read := func(line string) (got, bool) {
		var g got
		ok := ScanFlatLine([]byte(line), func(key []byte, v *FlatValue) bool {
			g.fields++
			var ok bool
			switch string(key) {
			case "id":
				g.id, ok = v.Uint()
			case "s":
				g.s, ok = v.String()
			case "ok":
				g.ok, ok = v.Bool()
			}
			return ok
		})
		return g, ok
	}
	if g, ok := read(`{"id":12,"s":"a-b_c","ok":true}`); !ok || g != (got{12, "a-b_c", true, 3}) {
		t.Errorf("plain line: %+v %v", g, ok)
	}
	if g, ok := read(`{"ok":false}`); !ok || g != (got{fields: 1}) {
		t.Errorf("false: %+v %v", g, ok)
	}
	for _, line := range []string{
		``, `{}`, `{"id":1`, `{"id":1}x`, `{"id":1} `, `{ "id":1}`, `{"id": 1}`, `{"id":01}`, `{"id":-1}`,
		`{"id":1.5}`, `{"id":1e3}`, `{"id":1234567890123456789}`, `{"s":"a\"b"}`, `{"s":"a\\b"}`, "{\"s\":\"\x01\"}",
		"{\"s\":\"\xc3\xa9\"}", `{"s":1}`, `{"ok":tru}`, `{"other":1}`, `{"id":1,}`, `{"i\u0064":1}`,
	} {
		if g, ok := read(line); ok {
			t.Errorf("%q read: %+v", line, g)
		}
	}
	for s, want := range map[string]bool{"": true, "ls_01-x.y": true, "a b": true, `a"b`: false, `a\b`: false, "<": false, ">": false, "&": false, "\x7f": false, "\n": false, "é": false} {
		if PlainJSONString(s) != want {
			t.Errorf("PlainJSONString(%q) = %v", s, !want)
		}
	}
}
