package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/node"
)

// TestServerLimitFlags: the count limits and HTTP hardening flags, their
// defaults, the environment, and refusals of bad values.
func TestServerLimitFlags(t *testing.T) {
	def := node.DefaultConfig()
	a, _, _ := testApp(nil)
	c, err := a.parseServerFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.node.MaxLeases != def.MaxLeases || c.node.MaxLeasesPerHolder != def.MaxLeasesPerHolder ||
		c.node.MaxSessions != def.MaxSessions || c.node.MaxSessionsPerHolder != def.MaxSessionsPerHolder ||
		c.node.MaxEventStreams != def.MaxEventStreams || c.streamsPerClient != api.DefaultMaxStreamsPerClient ||
		c.bodyTimeout != api.DefaultBodyTimeout || c.idleTimeout != 2*time.Minute {
		t.Errorf("defaults: %+v", c)
	}

	a, _, _ = testApp(map[string]string{"LEASEHOLD_MAX_SESSIONS": "7", "LEASEHOLD_HTTP_BODY_TIMEOUT": "5s"})
	c, err = a.parseServerFlags([]string{"--max-leases", "10", "--max-leases-per-holder", "0", "--max-sessions-per-holder", "3",
		"--max-event-streams", "4", "--max-event-streams-per-client", "2", "--http-idle-timeout", "30s"})
	if err != nil {
		t.Fatal(err)
	}
	if c.node.MaxLeases != 10 || c.node.MaxLeasesPerHolder != 0 || c.node.MaxSessions != 7 || c.node.MaxSessionsPerHolder != 3 ||
		c.node.MaxEventStreams != 4 || c.streamsPerClient != 2 || c.bodyTimeout != 5*time.Second || c.idleTimeout != 30*time.Second {
		t.Errorf("set: %+v", c)
	}
	if orNegative(0) != -1 || orNegative(time.Duration(0)) != -1 || orNegative(5) != 5 {
		t.Error("orNegative: 0 must become -1 (no limit for api.Options), others stay")
	}

	for _, args := range [][]string{
		{"--max-leases", "-1"},
		{"--max-event-streams", "-3"},
		{"--max-event-streams-per-client", "-1"},
		{"--http-body-timeout", "-1s"},
		{"--http-idle-timeout", "0s"},
	} {
		a, _, _ := testApp(nil)
		_, err := a.parseServerFlags(args)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(ue.msg, "negative") && !strings.Contains(ue.msg, "positive") {
			t.Errorf("%v: err = %v, want a usage error", args, err)
		}
	}
}
