package harness

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestTailKeepsTheLastLines: writes of one or several lines, from several
// writers at once, leave the last max lines, whole.
func TestTailKeepsTheLastLines(t *testing.T) {
	b := &tail{max: 5}
	b.Write([]byte("a\nb\n"))
	b.Write([]byte("c"))
	if got := b.String(); got != "a\nb\nc" {
		t.Fatalf("after 3 lines: %q", got)
	}
	for i := range 10 {
		fmt.Fprintf(b, "line %d\n", i)
	}
	if got, want := b.String(), "line 5\nline 6\nline 7\nline 8\nline 9"; got != want {
		t.Fatalf("after 13 lines: %q, want %q", got, want)
	}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(b, "w%d %d\n", w, i)
			}
		})
	}
	wg.Wait()
	lines := strings.Split(b.String(), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines kept, want 5: %q", len(lines), lines)
	}
	for _, l := range lines {
		var w, i int
		if n, _ := fmt.Sscanf(l, "w%d %d", &w, &i); n != 2 {
			t.Fatalf("a line cut or mixed: %q", l)
		}
	}
}
