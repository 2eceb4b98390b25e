package client

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/leasehold/leasehold/wire"
)

// TestStreamJSONIsEncodingJSONs: appendRenewalLine writes encoding/json's
// bytes for every renewal it takes (and takes the usual ones);
// parseAnswerLine reads the server's usual answers, and every line it
// accepts, among random edits of answers, reads as encoding/json reads it.
func TestStreamJSONIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	strs := []string{"", "ls_0123456789abcdef", "tok-AZ_09", `quo"te`, "<&>", "é", "\x01"}
	took := 0
	for i := range 10000 {
		r := wire.KeepAliveRenewal{ID: rng.Uint64() >> rng.IntN(64), LeaseID: strs[rng.IntN(len(strs))], Token: strs[rng.IntN(len(strs))]}
		if rng.IntN(2) == 0 {
			r.TTLMS = rng.Int64() - rng.Int64()
		}
		if rng.IntN(5) == 0 {
			r.Metadata = map[string]string{"a": "b"}
		}
		want, _ := json.Marshal(r)
		got, ok := appendRenewalLine([]byte("x"), r)
		if !ok {
			if r.Metadata == nil && wire.PlainJSONString(r.LeaseID) && wire.PlainJSONString(r.Token) {
				t.Fatalf("renewal %d: refused %s", i, want)
			}
			continue
		}
		took++
		if !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("renewal %d:\n got %s\nwant x%s", i, got, want)
		}
	}
	if took < 1000 {
		t.Fatalf("%d of 10000 renewals written: the fast path is not exercised", took)
	}

	alphabet := []byte(`{}":,0123456789-.eE \\tuflsa_TZ+` + "\xff")
	usual, accepted := 0, 0
	for i := range 40000 {
		at := time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)*int64(rng.IntN(2))).UTC().Truncate(time.Duration(rng.IntN(2)) * time.Millisecond)
		a := wire.KeepAliveAnswer{ID: rng.Uint64() >> rng.IntN(64), LeaseID: strs[rng.IntN(3)], OK: rng.IntN(4) > 0,
			FencingToken: rng.Uint64() >> rng.IntN(64), TTLMS: rng.Int64N(1e6), RemainingMS: rng.Int64N(1e6), ExpiresAt: &at,
			RenewalCount: rng.Uint32() >> rng.IntN(32)}
		if rng.IntN(5) == 0 {
			a.ExpiresAt = nil
		}
		if rng.IntN(8) == 0 {
			a.Status, a.Error = 404, &wire.Error{Code: wire.CodeNotFound, Message: "gone"}
		}
		line, _ := json.Marshal(a)
		edited := rng.IntN(2) == 0
		if edited {
			for range 1 + rng.IntN(2) {
				switch k := rng.IntN(len(line)); rng.IntN(3) {
				case 0:
					line[k] = alphabet[rng.IntN(len(alphabet))]
				case 1:
					line = append(line[:k], line[k+1:]...)
				default:
					line = append(line[:k], append([]byte{alphabet[rng.IntN(len(alphabet))]}, line[k:]...)...)
				}
			}
		}
		var fast, slow wire.KeepAliveAnswer
		if !parseAnswerLine(line, &fast) {
			if !edited && a.Error == nil && a.ID < 1e18 && a.FencingToken < 1e18 {
				t.Fatalf("answer %d: refused the usual answer %s", i, line)
			}
			continue
		}
		accepted++
		if !edited {
			usual++
		}
		if err := json.Unmarshal(line, &slow); err != nil {
			t.Fatalf("answer %d %q: accepted, but encoding/json refuses it: %v", i, line, err)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("answer %d %q: read %+v, encoding/json reads %+v", i, line, fast, slow)
		}
	}
	if usual < 10000 || accepted-usual < 100 {
		t.Fatalf("%d usual and %d edited answers accepted: the cases are not exercised", usual, accepted-usual)
	}
}
