package fsm

import "unicode/utf8"

func validUTF8(s string) bool { return utf8.ValidString(s) }

// toValidUTF8 returns s with every byte that is not part of valid UTF-8
// replaced by U+FFFD, one for each byte, as encoding/json does.
func toValidUTF8(s string) string {
	out := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, s[i:i+size]...)
		}
		i += size
	}
	return string(out)
}
