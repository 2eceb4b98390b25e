package api

import (
	"strings"
	"testing"
	"time"
)

// TestOptionsValidate: the defaults and the zero value validate and serve
// alike; Validate names every problem at once; New and NewControl refuse
// options that do not validate.
func TestOptionsValidate(t *testing.T) {
	if err := DefaultOptions().Validate(); err != nil {
		t.Fatalf("DefaultOptions: %v", err)
	}
	if err := (Options{}).Validate(); err != nil {
		t.Fatalf("the zero Options: %v", err)
	}
	if err := (Options{BodyTimeout: -1, WriteTimeout: -1, MaxStreamsPerClient: -1}).Validate(); err != nil {
		t.Fatalf("negative: no limit: %v", err)
	}
	zero, def := New(newFake(), Options{}).(*server), New(newFake(), DefaultOptions()).(*server)
	if zero.maxBody != def.maxBody || zero.keepAlive != def.keepAlive || zero.bodyTimeout != def.bodyTimeout ||
		zero.writeTimeout != def.writeTimeout || zero.streams.max != def.streams.max || zero.fwd.timeout != def.fwd.timeout {
		t.Fatalf("the zero Options serve otherwise than DefaultOptions")
	}

	bad := Options{MaxBodyBytes: -1, KeepAlive: -time.Second, ForwardTimeout: -time.Second,
		Control: ControlOptions{MaxMessageBytes: -1, MaxSockets: -1, MaxTTL: 10 * time.Millisecond}}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid options validate")
	}
	for _, want := range []string{"max body bytes -1", "keep-alive interval -1s", "forward timeout -1s",
		"control: max message bytes -1", "max sockets -1", "max TTL 10ms is below"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %q does not say %q", err, want)
		}
	}
	if err := DefaultControlOptions().Validate(); err != nil {
		t.Fatalf("DefaultControlOptions: %v", err)
	}
	for name, f := range map[string]func(){
		"New":        func() { New(newFake(), bad) },
		"NewControl": func() { NewControl(nil, bad.Control) },
	} {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.Contains(v.(error).Error(), "max sockets -1") {
					t.Errorf("%s with invalid options: panic %v", name, v)
				}
			}()
			f()
		}()
	}
}

// TestOptionsValidateMessages pins the words of every refusal of a
// negative option.
func TestOptionsValidateMessages(t *testing.T) {
	err := Options{MaxBodyBytes: -1, KeepAlive: -time.Second, ForwardTimeout: -time.Millisecond,
		Control: ControlOptions{MaxMessageBytes: -2, MaxSockets: -3, MaxTTL: -time.Minute}}.Validate()
	want := "max body bytes -1 is negative (0: the default, 65536)\n" +
		"keep-alive interval -1s is negative (0: the default, 15s)\n" +
		"forward timeout -1ms is negative (0: the default, 3s)\n" +
		"control: max message bytes -2 is negative (0: the default, 4096)\n" +
		"max sockets -3 is negative (0: the default, 256)\n" +
		"max TTL -1m0s is negative (0: the default, 1m0s)"
	if err == nil || err.Error() != want {
		t.Errorf("Validate = %q, want %q", err, want)
	}
}
