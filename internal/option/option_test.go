package option

import (
	"testing"
	"time"
)

func TestOrNone(t *testing.T) {
	for _, tt := range []struct{ v, def, want int }{{0, 5, 5}, {-1, 5, 0}, {3, 5, 3}} {
		if got := OrNone(tt.v, tt.def); got != tt.want {
			t.Errorf("OrNone(%d, %d) = %d, want %d", tt.v, tt.def, got, tt.want)
		}
	}
	if got := OrNone(-time.Second, time.Minute); got != 0 {
		t.Errorf("OrNone(-1s, 1m) = %v, want 0", got)
	}
}
