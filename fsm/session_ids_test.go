package fsm

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestWithoutIDKeepsOlderVersions drives a session's lease list the way
// the state machine does (a grant appends to the latest version in place,
// a release takes withoutID of it) and checks after every step that the
// latest version holds what a copy-and-delete would, and that every older
// version still reads what it read when it was the latest.
func TestWithoutIDKeepsOlderVersions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	type version struct {
		ids  []string // shares arrays with the others
		want []string // its contents, copied when it was made
	}
	var latest []string
	var model []string
	var versions []version
	next := 0
	for step := range 4000 {
		switch k := rng.IntN(10); {
		case k < 4 || len(model) == 0:
			id := fmt.Sprintf("ls_%04d", next)
			next++
			latest = append(latest, id)
			model = append(model, id)
		default:
			var id string
			switch k {
			case 4, 5:
				id = model[0]
			case 6, 7:
				id = model[len(model)-1]
			case 8:
				id = model[rng.IntN(len(model))]
			default:
				id = "ls_absent"
			}
			latest = withoutID(latest, id)
			model = slices.DeleteFunc(slices.Clone(model), func(x string) bool { return x == id })
		}
		if !slices.Equal(latest, model) {
			t.Fatalf("step %d: latest %v, want %v", step, latest, model)
		}
		versions = append(versions, version{ids: latest, want: slices.Clone(latest)})
		for i, v := range versions {
			if !slices.Equal(v.ids, v.want) {
				t.Fatalf("step %d: version %d now reads %v, it held %v", step, i, v.ids, v.want)
			}
		}
	}
}

// TestSessionReleasesKeepEventsIntact releases a session's leases first,
// last and from the middle, with grants in between, and checks that the
// session records the state machine handed out earlier (what an event or
// an answer holds) are unchanged, and that the current one lists exactly
// the active leases in grant order.
func TestSessionReleasesKeepEventsIntact(t *testing.T) {
	f := New()
	idx := uint64(0)
	ap := func(c Command) []Result { idx++; return f.Apply(idx, c) }
	ap(&Tick{Tick: 1, PeriodMS: 100})
	ap(&SessionCreate{SessionID: "S", Holder: "w", TokenHash: HashOf("s"), TTLMS: 100000, TTLTicks: 1000})
	var model []string
	grant := func(i int) {
		id := fmt.Sprintf("ls_%03d", i)
		if r := ap(&Acquire{LeaseID: id, Key: fmt.Sprint("k", i), Limit: 1, SessionID: "S", SessionTokenHash: HashOf("s"),
			TokenHash: HashOf(id)}); r[0].Err != nil {
			t.Fatalf("acquire %s: %v", id, r[0].Err)
		}
		model = append(model, id)
	}
	release := func(id string) {
		if r := ap(&Release{LeaseID: id, SessionTokenHash: HashOf("s")}); r[0].Err != nil {
			t.Fatalf("release %s: %v", id, r[0].Err)
		}
		model = slices.DeleteFunc(model, func(x string) bool { return x == id })
	}
	type held struct {
		s    *Session
		want []string
	}
	var seen []held
	look := func() {
		s := f.sessions["S"]
		if !slices.Equal(s.LeaseIDs, model) {
			t.Fatalf("session lists %v, want %v", s.LeaseIDs, model)
		}
		seen = append(seen, held{s, slices.Clone(s.LeaseIDs)})
		for i, h := range seen {
			if !slices.Equal(h.s.LeaseIDs, h.want) {
				t.Fatalf("record %d now lists %v, it listed %v", i, h.s.LeaseIDs, h.want)
			}
		}
	}
	for i := range 12 {
		grant(i)
		look()
	}
	for i, pick := range []int{0, -1, 5, 0, -1, 2, 0} {
		id := model[(pick+len(model))%len(model)]
		release(id)
		look()
		grant(100 + i)
		look()
	}
	for len(model) > 0 {
		release(model[0])
		look()
	}
}

// BenchmarkSessionReleaseAll releases, one entry of 100 each, every lease
// of a session of 30,000, in grant order and in random order.
func BenchmarkSessionReleaseAll(b *testing.B) {
	const n = 30_000
	for _, order := range []string{"granted", "random"} {
		b.Run(order, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				f := New()
				idx := fillSession(f, n, 100000)
				ids := slices.Clone(f.sessions["ss_storm"].LeaseIDs)
				if order == "random" {
					rand.New(rand.NewPCG(5, 6)).Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
				}
				b.StartTimer()
				for i := 0; i < len(ids); i += 100 {
					batch := &Batch{}
					for _, id := range ids[i:min(len(ids), i+100)] {
						batch.Commands = append(batch.Commands, &Release{LeaseID: id, SessionTokenHash: HashOf("s"), WallMS: 2})
					}
					f.Apply(idx, batch)
					idx++
					f.DrainEvents(func(*Event) {})
				}
				if f.active != 0 {
					b.Fatalf("%d leases still active", f.active)
				}
			}
		})
	}
}

// TestSortTimersOrder checks sortTimers and mergeTimers against a
// comparison sort: kinds mixed, duplicates, ids with and without a shared
// prefix, ties on the first 8 bytes after it, and sizes on both sides of
// the small-slice cut.
func TestSortTimersOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ids := []func() string{
		func() string { return fmt.Sprintf("ls_%016x", rng.Uint64()) },
		func() string { return fmt.Sprintf("ls_00000000%03d", rng.IntN(50)) },
		func() string { return fmt.Sprintf("camera/%d\x00ls_%x", rng.IntN(20), rng.IntN(1000)) },
		func() string { return fmt.Sprintf("%c%d", 'a'+rng.IntN(3), rng.IntN(5)) },
	}
	gen := func(n int) []timer {
		ts := make([]timer, n)
		for i := range ts {
			if i > 0 && rng.IntN(8) == 0 {
				ts[i] = ts[rng.IntN(i)] // a duplicate
				continue
			}
			ts[i] = timer{kind: uint8(1 + rng.IntN(4)), id: ids[rng.IntN(len(ids))]()}
		}
		return ts
	}
	for _, n := range []int{0, 1, 2, 63, 64, 65, 500, 5000} {
		for try := range 6 {
			ts := gen(n)
			if try == 0 {
				// The first names share a long prefix that a later one
				// lacks: nameOrder's guess of the prefix is too long and
				// its keys are taken again.
				for i := range min(len(ts), 20) {
					ts[i].id = fmt.Sprintf("ls_0000000000%04d", rng.IntN(30))
				}
			}
			want := slices.Clone(ts)
			slices.SortFunc(want, timerLess)
			got := slices.Clone(ts)
			sortTimers(got)
			if !slices.Equal(got, want) {
				t.Fatalf("n=%d: sortTimers differs from a comparison sort", n)
			}
			other := gen(rng.IntN(200))
			sortTimers(other)
			merged := mergeTimers(slices.Clone(got), other)
			all := append(slices.Clone(ts), other...)
			slices.SortFunc(all, timerLess)
			if !slices.Equal(merged, all) {
				t.Fatalf("n=%d: mergeTimers differs from sorting both", n)
			}
		}
	}
}
