package chaos

import (
	"strings"
	"testing"
)

func TestCheckConfiguration(t *testing.T) {
	won := func(term string) string {
		return `time=2026-01-01T00:00:00Z level=INFO msg="election won" component=raft term=` + term + " tally=2\n"
	}
	conf := func(servers ...string) string {
		var b strings.Builder
		for _, s := range servers {
			kind, id, _ := strings.Cut(s, ":")
			b.WriteString("{Suffrage:" + kind + " ID:" + id + " Address:10.0.0.1:7701} ")
		}
		return `time=2026-01-01T00:00:00Z level=INFO msg="updating configuration" component=raft command=RemoveServer server-id=n2 servers="[` +
			strings.TrimSpace(b.String()) + `]"` + "\n"
	}
	start := func(servers ...string) string {
		return strings.Replace(strings.Replace(conf(servers...), "updating configuration", "initial configuration", 1), "command=RemoveServer server-id=n2 ", "index=9 ", 1)
	}
	s := func(node int, voters string) configSample { return configSample{node: node, voters: voters} }
	// at stamps a line with another time (of 2026-01-01T00:00:SS).
	at := func(sec, line string) string {
		return strings.Replace(line, "time=2026-01-01T00:00:00Z", "time=2026-01-01T00:00:"+sec+"Z", 1)
	}
	for _, tc := range []struct {
		name    string
		logs    map[string]string
		samples []configSample
		valid   bool
		count   string
	}{
		{name: "one leader per term", logs: map[string]string{"n0.log": won("2") + won("4"), "n1.log": won("3")}, valid: true},
		{name: "two leaders in a term", logs: map[string]string{"n0.log": won("2"), "n1.log": won("3") + won("2")}, count: "double-leaders"},
		{name: "no election in the logs", logs: map[string]string{"n0.log": "nothing\n"}},
		{name: "one voter at a time", logs: map[string]string{"n0.log": won("2")},
			samples: []configSample{s(0, "n0 n1 n2"), s(1, "n0 n1 n2"), s(0, "n0 n1"), s(0, "n0 n1 n2"), s(1, "n0 n1 n2 n3")}, valid: true},
		{name: "a jump to an appended configuration (a node that was away)",
			logs:    map[string]string{"n0.log": won("2") + conf("Voter:n0", "Voter:n1", "Nonvoter:n2") + conf("Voter:n0", "Voter:n1")},
			samples: []configSample{s(2, "n0 n1 n2 n3"), s(2, "n0 n1")}, valid: true},
		{name: "a jump by two voters to a configuration no leader appended",
			logs:    map[string]string{"n0.log": won("2") + conf("Voter:n0", "Voter:n1")},
			samples: []configSample{s(2, "n0 n1 n2"), s(2, "n2")}, count: "multi-voter-changes"},
		{name: "a restart with the configuration the cluster had",
			logs:    map[string]string{"n0.log": won("2") + start("Voter:n0", "Voter:n1", "Voter:n2")},
			samples: []configSample{s(1, "n0 n1 n2")}, valid: true},
		{name: "a start with a configuration the cluster never had",
			logs:    map[string]string{"n0.log": won("2") + start("Voter:n0")},
			samples: []configSample{s(1, "n0 n1 n2")}, count: "multi-voter-changes"},
		{name: "a restart with a configuration a leader appended before it",
			logs: map[string]string{"n0.log": won("2") + at("05", conf("Voter:n0", "Voter:n1", "Voter:n2", "Voter:n3")),
				"n3.log": at("09", start("Voter:n0", "Voter:n1", "Voter:n2", "Voter:n3"))},
			samples: []configSample{s(1, "n0 n1 n2"), s(1, "n0 n1 n2 n3")}, valid: true},
		// canary_config_recover when the rewritten server elects itself
		// before a leader reaches it: as the one voter it adds the others
		// back as non-voters, so a leader appended its voter set, but only
		// after it started with it.
		{name: "a rewritten server that appends its own configuration after it starts",
			logs: map[string]string{"n0.log": won("2"),
				"n3.log": at("09", start("Voter:n3")) + at("10", won("3")) + at("11", conf("Voter:n3", "Nonvoter:n0")) +
					at("12", conf("Voter:n3", "Nonvoter:n0", "Nonvoter:n1"))},
			samples: []configSample{s(3, "n0 n1 n2 n3 n4"), s(3, "n3")}, count: "multi-voter-changes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := CheckConfiguration(tc.logs, tc.samples)
			if v.Valid != tc.valid {
				t.Fatalf("valid %v, want %v: %s %v", v.Valid, tc.valid, v.Detail, v.Samples)
			}
			if tc.count != "" && v.Counts[tc.count] == 0 {
				t.Fatalf("counts %v: want %s", v.Counts, tc.count)
			}
		})
	}
	if d := voterDiff("n0 n1 n2", "n0 n3"); d != 3 {
		t.Fatalf("voterDiff: %d, want 3", d)
	}
}
