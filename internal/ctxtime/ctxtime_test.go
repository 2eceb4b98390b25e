package ctxtime

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	live := context.Background()
	done, cancel := context.WithCancel(live)
	cancel()
	if err := Sleep(live, time.Millisecond); err != nil {
		t.Errorf("a sleep that ran out: %v", err)
	}
	if err := Sleep(live, 0); err != nil {
		t.Errorf("no sleep: %v", err)
	}
	if err := Sleep(done, -time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("no sleep, ctx ended: %v", err)
	}
	if err := Sleep(done, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a sleep its ctx cut short: %v", err)
	}
}
