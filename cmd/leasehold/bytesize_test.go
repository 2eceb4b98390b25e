package main

import (
	"errors"
	"strings"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "-1": -1, "4096": 4096, "256MiB": 256 << 20, "256mib": 256 << 20, "64M": 64 << 20,
		"1GiB": 1 << 30, "2 GB": 2 << 30, "10KiB": 10 << 10, "3T": 3 << 40, "512B": 512,
	} {
		got, err := parseByteSize(in)
		if err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "1.5GiB", "ten", "99999999999TiB"} {
		if _, err := parseByteSize(in); err == nil {
			t.Errorf("parseByteSize(%q): no error", in)
		}
	}
	var v int64 = 256 << 20
	if s := (byteSize{&v}).String(); s != "256MiB" {
		t.Errorf("String: %q", s)
	}
}

func TestServerFlagsMinFreeDisk(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{{nil, 0}, {[]string{"--min-free-disk", "1GiB"}, 1 << 30}, {[]string{"--min-free-disk=-1"}, -1}} {
		a, _, _ := testApp(nil)
		cfg, err := a.parseServerFlags(tc.args)
		if err != nil || cfg.node.MinFreeDisk != tc.want {
			t.Errorf("%v: %d, %v; want %d", tc.args, cfg.node.MinFreeDisk, err, tc.want)
		}
	}
	a, _, _ := testApp(map[string]string{"LEASEHOLD_MIN_FREE_DISK": "2GiB"})
	if cfg, err := a.parseServerFlags(nil); err != nil || cfg.node.MinFreeDisk != 2<<30 {
		t.Errorf("LEASEHOLD_MIN_FREE_DISK=2GiB: %d, %v", cfg.node.MinFreeDisk, err)
	}
	if _, err := a.parseServerFlags([]string{"--min-free-disk", "lots"}); err == nil {
		t.Error("--min-free-disk lots: no error")
	}
}

// The test-only raft-wal segment size: unset is raft-wal's default; a
// size out of bounds or not a size is a usage error; it is no flag and not
// in the help.
func TestServerTestWALSegmentSize(t *testing.T) {
	for _, tc := range []struct {
		env  string
		want int
		bad  bool
	}{{"", 0, false}, {"8MiB", 8 << 20, false}, {"1048576", 1 << 20, false}, {"1GiB", 1 << 30, false},
		{"512KiB", 0, true}, {"2GiB", 0, true}, {"-8MiB", 0, true}, {"lots", 0, true}} {
		a, _, _ := testApp(map[string]string{testWALSegmentEnv: tc.env})
		cfg, err := a.parseServerFlags(nil)
		var ue *usageError
		switch {
		case tc.bad && (!errors.As(err, &ue) || !strings.Contains(err.Error(), testWALSegmentEnv)):
			t.Errorf("%s=%q: %v, want a usage error naming it", testWALSegmentEnv, tc.env, err)
		case !tc.bad && (err != nil || cfg.node.WALSegmentSize != tc.want):
			t.Errorf("%s=%q: %d, %v; want %d", testWALSegmentEnv, tc.env, cfg.node.WALSegmentSize, err, tc.want)
		}
	}
	a, out, errb := testApp(nil)
	a.parseServerFlags([]string{"--help"})
	help := out.String() + errb.String()
	if !strings.Contains(help, "raft-log") || strings.Contains(help, testWALSegmentEnv) {
		t.Errorf("the server's help (want it without the test-only variable):\n%s", help)
	}
}
