package node

import (
	"context"
	"testing"
	"time"
)

// TestConfigZeroRule: a zero numeric field means its default, a negative
// one off or no limit where the field allows it (withDefaults, which Open
// runs the node on), and invalid elsewhere.
func TestConfigZeroRule(t *testing.T) {
	def := DefaultConfig()
	zero := Config{NodeID: "n1", InMemory: true, GossipAddr: def.GossipAddr}
	if err := zero.Validate(); err != nil {
		t.Fatalf("a config with every numeric field zero: %v", err)
	}
	got := zero.withDefaults()
	for name, f := range map[string][2]int64{
		"JoinTimeout":          {int64(got.JoinTimeout), int64(def.JoinTimeout)},
		"StabilizationTime":    {int64(got.StabilizationTime), int64(def.StabilizationTime)},
		"GrantKeyRetention":    {int64(got.GrantKeyRetention), int64(def.GrantKeyRetention)},
		"StateCheckInterval":   {int64(got.StateCheckInterval), int64(def.StateCheckInterval)},
		"MaxWait":              {int64(got.MaxWait), int64(def.MaxWait)},
		"MaxLockDelay":         {int64(got.MaxLockDelay), int64(def.MaxLockDelay)},
		"MaxLeases":            {int64(got.MaxLeases), int64(def.MaxLeases)},
		"MaxLeasesPerHolder":   {int64(got.MaxLeasesPerHolder), int64(def.MaxLeasesPerHolder)},
		"MaxSessions":          {int64(got.MaxSessions), int64(def.MaxSessions)},
		"MaxSessionsPerHolder": {int64(got.MaxSessionsPerHolder), int64(def.MaxSessionsPerHolder)},
		"MaxWaitersPerKey":     {int64(got.MaxWaitersPerKey), int64(def.MaxWaitersPerKey)},
		"MaxWaitersPerHolder":  {int64(got.MaxWaitersPerHolder), int64(def.MaxWaitersPerHolder)},
		"MaxRetained":          {int64(got.MaxRetained), int64(def.MaxRetained)},
		"MaxEventStreams":      {int64(got.MaxEventStreams), int64(def.MaxEventStreams)},
		"MinQuorum":            {int64(got.MinQuorum), int64(def.MinQuorum)},
		"TickPeriod":           {int64(got.TickPeriod), int64(def.TickPeriod)},
		"Retention":            {int64(got.Retention), int64(def.Retention)},
		"MinTTL":               {int64(got.MinTTL), int64(def.MinTTL)},
		"MaxTTL":               {int64(got.MaxTTL), int64(def.MaxTTL)},
		"EventHistory":         {int64(got.EventHistory), int64(def.EventHistory)},
		"SnapshotThreshold":    {int64(got.SnapshotThreshold), int64(def.SnapshotThreshold)},
		"SnapshotInterval":     {int64(got.SnapshotInterval), int64(def.SnapshotInterval)},
		"ApplyTimeout":         {int64(got.ApplyTimeout), int64(def.ApplyTimeout)},
		"MaxBatch":             {int64(got.MaxBatch), int64(def.MaxBatch)},
	} {
		if f[0] != f[1] || f[0] == 0 {
			t.Errorf("%s: zero became %d, want the default %d", name, f[0], f[1])
		}
	}
	if got.DeadServerTimeout != 0 {
		t.Errorf("DeadServerTimeout: zero became %v, want 0 (its default, off)", got.DeadServerTimeout)
	}

	off := DefaultConfig()
	off.JoinTimeout, off.DeadServerTimeout, off.StabilizationTime, off.GrantKeyRetention = -1, -1, -1, -1
	off.StateCheckInterval, off.MaxWait, off.MaxLockDelay = -time.Second, -1, -1
	off.MaxLeases, off.MaxLeasesPerHolder, off.MaxSessions, off.MaxSessionsPerHolder = -1, -1, -1, -1
	off.MaxWaitersPerKey, off.MaxWaitersPerHolder, off.MaxRetained, off.MaxEventStreams = -1, -1, -1, -5
	if err := off.Validate(); err != nil {
		t.Fatalf("negative offs and no-limits: %v", err)
	}
	o := off.withDefaults()
	if o.JoinTimeout != 0 || o.DeadServerTimeout != 0 || o.StabilizationTime != 0 || o.GrantKeyRetention != 0 ||
		o.StateCheckInterval != 0 || o.MaxWait != 0 || o.MaxLockDelay != 0 || o.MaxLeases != 0 || o.MaxLeasesPerHolder != 0 ||
		o.MaxSessions != 0 || o.MaxSessionsPerHolder != 0 || o.MaxWaitersPerKey != 0 || o.MaxWaitersPerHolder != 0 ||
		o.MaxRetained != 0 || o.MaxEventStreams != 0 {
		t.Errorf("negatives must become the code's none (0): %+v", o)
	}
	set := DefaultConfig()
	set.MaxLeases, set.StateCheckInterval = 7, time.Minute
	if s := set.withDefaults(); s.MaxLeases != 7 || s.StateCheckInterval != time.Minute {
		t.Errorf("set values must stay: %d %v", s.MaxLeases, s.StateCheckInterval)
	}

	for name, mutate := range map[string]func(*Config){
		"TickPeriod":   func(c *Config) { c.TickPeriod = -time.Second },
		"Retention":    func(c *Config) { c.Retention = -time.Second },
		"EventHistory": func(c *Config) { c.EventHistory = -1 },
		"ApplyTimeout": func(c *Config) { c.ApplyTimeout = -1 },
		"MaxTTL":       func(c *Config) { c.MaxTTL = -1 },
	} {
		c := DefaultConfig()
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("%s: a negative value that cannot mean off was accepted", name)
		}
	}
}

// TestConfigNegativeOffRuns: Open runs a node on its config's defaults:
// with the state check off (negative) it has none, and a lease limit of
// -1 travels in its commands as none (0), where the default's would not.
func TestConfigNegativeOffRuns(t *testing.T) {
	hook := func(context.Context, string, uint64) (string, error) { return "", nil }
	cfg := testConfig(t, "")
	cfg.StateCheckInterval = -1
	cfg.MaxLeases = -1
	cfg.peerHashHook = hook
	n := openNode(t, cfg)
	if n.sc.canCheck() {
		t.Error("the state check runs with a negative StateCheckInterval")
	}
	if q := n.cfg.quota(); q.Leases != 0 {
		t.Errorf("lease limit travels as %d, want 0 (none)", q.Leases)
	}
	on := DefaultConfig().withDefaults()
	on.peerHashHook = hook
	if !(&stateCheck{cfg: &on}).canCheck() || on.quota().Leases != uint64(DefaultConfig().MaxLeases) {
		t.Error("the default config must check state and limit leases")
	}
}
