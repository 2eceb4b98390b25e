package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/node"
)

// testApp returns an app whose environment is env and whose output is
// captured.
func testApp(env map[string]string) (*app, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	return &app{
		stdout: &out, stderr: &errb,
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok },
	}, &out, &errb
}

func TestEnvName(t *testing.T) {
	for flagName, want := range map[string]string{
		"http-addr":        "LEASEHOLD_HTTP_ADDR",
		"addr":             "LEASEHOLD_ADDR",
		"bootstrap-expect": "LEASEHOLD_BOOTSTRAP_EXPECT",
		"lease-token":      "LEASEHOLD_LEASE_TOKEN",
	} {
		if got := envName(flagName); got != want {
			t.Errorf("envName(%q) = %q, want %q", flagName, got, want)
		}
	}
}

func TestServerFlags(t *testing.T) {
	def := node.DefaultConfig()
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, c serverConfig)
		usage string // non-empty: a usage error containing this
	}{
		{
			name: "defaults with no flags",
			check: func(t *testing.T, c serverConfig) {
				if c.node.NodeID != "node1" || c.node.DataDir != "./leasehold-data" || c.httpAddr != "127.0.0.1:7700" ||
					c.node.RaftAddr != "127.0.0.1:7701" || c.node.GossipAddr != "127.0.0.1:7702" {
					t.Errorf("defaults: %+v", c)
				}
				if c.node.BootstrapExpect != def.BootstrapExpect || c.node.TickPeriod != def.TickPeriod ||
					c.node.Retention != def.Retention || len(c.node.Join) != 0 || c.tokensFile != "" ||
					c.logLevel != slog.LevelInfo || c.logFormat != "text" || c.node.RaftAdvertise != "" {
					t.Errorf("defaults: %+v", c)
				}
			},
		},
		{
			name: "every flag",
			args: []string{"--node-id", "n2", "--data-dir", "/d", "--http-addr", "0.0.0.0:8000", "--http-advertise", "h:8000",
				"--raft-addr", "10.0.0.1:8001", "--raft-advertise", "r:8001", "--gossip-addr", "10.0.0.1:8002",
				"--bootstrap-expect", "1", "--tick-period", "50ms", "--retention", "2h",
				"--tokens-file", "/t.json", "--log-level", "debug", "--log-format", "json"},
			check: func(t *testing.T, c serverConfig) {
				n := c.node
				if n.NodeID != "n2" || n.DataDir != "/d" || c.httpAddr != "0.0.0.0:8000" || c.httpAdvertise != "h:8000" ||
					n.RaftAddr != "10.0.0.1:8001" || n.RaftAdvertise != "r:8001" || n.GossipAddr != "10.0.0.1:8002" ||
					len(n.Join) != 0 || n.BootstrapExpect != 1 ||
					n.TickPeriod != 50*time.Millisecond || n.Retention != 2*time.Hour || c.tokensFile != "/t.json" ||
					c.logLevel != slog.LevelDebug || c.logFormat != "json" {
					t.Errorf("got %+v", c)
				}
			},
		},
		{
			name: "environment fills in",
			env: map[string]string{"LEASEHOLD_NODE_ID": "envnode", "LEASEHOLD_HTTP_ADDR": "127.0.0.1:9000",
				"LEASEHOLD_BOOTSTRAP_EXPECT": "0", "LEASEHOLD_TICK_PERIOD": "20ms",
				"LEASEHOLD_LOG_FORMAT": "json", "LEASEHOLD_TOKENS_FILE": "/env.json"},
			check: func(t *testing.T, c serverConfig) {
				if c.node.NodeID != "envnode" || c.httpAddr != "127.0.0.1:9000" ||
					c.node.BootstrapExpect != 0 || c.node.TickPeriod != 20*time.Millisecond || c.logFormat != "json" ||
					c.tokensFile != "/env.json" {
					t.Errorf("got %+v", c)
				}
				if c.node.RaftAddr != "127.0.0.1:7701" {
					t.Errorf("unset variable changed raft addr: %q", c.node.RaftAddr)
				}
			},
		},
		{
			name: "flags win over the environment",
			args: []string{"-node-id=flagnode", "--http-addr", "127.0.0.1:9100"},
			env:  map[string]string{"LEASEHOLD_NODE_ID": "envnode", "LEASEHOLD_HTTP_ADDR": "127.0.0.1:9000", "LEASEHOLD_DATA_DIR": "/envdata"},
			check: func(t *testing.T, c serverConfig) {
				if c.node.NodeID != "flagnode" || c.httpAddr != "127.0.0.1:9100" || c.node.DataDir != "/envdata" {
					t.Errorf("got %+v", c)
				}
			},
		},
		{
			name: "empty variable is ignored",
			env:  map[string]string{"LEASEHOLD_NODE_ID": ""},
			check: func(t *testing.T, c serverConfig) {
				if c.node.NodeID != "node1" {
					t.Errorf("node id %q", c.node.NodeID)
				}
			},
		},
		{name: "join and bootstrap-expect from env and flags",
			env:  map[string]string{"LEASEHOLD_JOIN": "x:1,y:2", "LEASEHOLD_ADVERTISE_ADDR": "10.0.0.5"},
			args: []string{"--bootstrap-expect", "3", "--dead-server-timeout", "10m"},
			check: func(t *testing.T, c serverConfig) {
				if len(c.node.Join) != 2 || c.node.Join[1] != "y:2" || c.node.BootstrapExpect != 3 ||
					c.node.AdvertiseAddr != "10.0.0.5" || c.node.DeadServerTimeout != 10*time.Minute {
					t.Errorf("cluster flags: %+v", c.node)
				}
			},
		},
		{name: "bootstrap-expect above 1 needs join", args: []string{"--bootstrap-expect", "3"}, usage: "join addresses"},
		{name: "bad env duration", env: map[string]string{"LEASEHOLD_TICK_PERIOD": "soon"}, usage: "LEASEHOLD_TICK_PERIOD"},
		{name: "bad env number", env: map[string]string{"LEASEHOLD_BOOTSTRAP_EXPECT": "three"}, usage: "LEASEHOLD_BOOTSTRAP_EXPECT"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, usage: "--log-level"},
		{name: "bad log format", args: []string{"--log-format", "xml"}, usage: "--log-format"},
		{name: "tick period out of range", args: []string{"--tick-period", "1ms"}, usage: "tick period"},
		{name: "stray argument", args: []string{"extra"}, usage: "no arguments"},
		{name: "raft log store", env: map[string]string{"LEASEHOLD_RAFT_LOG": "wal"},
			check: func(t *testing.T, c serverConfig) {
				if c.node.RaftLog != "wal" {
					t.Errorf("raft log %q", c.node.RaftLog)
				}
			},
		},
		{name: "no raft log store: the directory's, or the default", check: func(t *testing.T, c serverConfig) {
			if c.node.RaftLog != "" {
				t.Errorf("raft log %q", c.node.RaftLog)
			}
		}},
		{name: "bad raft log store", args: []string{"--raft-log", "rocks"}, usage: `raft log store "rocks": want boltdb or wal`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _, _ := testApp(tt.env)
			c, err := a.parseServerFlags(tt.args)
			if tt.usage != "" {
				var ue *usageError
				if !errors.As(err, &ue) || !strings.Contains(ue.msg, tt.usage) {
					t.Fatalf("err = %v, want a usage error about %q", err, tt.usage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

func TestServerUnknownFlag(t *testing.T) {
	a, _, errb := testApp(nil)
	_, err := a.parseServerFlags([]string{"--bogus"})
	if !errors.Is(err, errUsageShown) || report(err, errb) != 2 {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(errb.String(), "flag provided but not defined") || !strings.Contains(errb.String(), "--http-addr") && !strings.Contains(errb.String(), "-http-addr") {
		t.Errorf("stderr = %q", errb.String())
	}
}

func TestClientFlagsEnv(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		env       map[string]string
		wantAddr  string
		wantToken string
		wantLT    string
		wantPos   []string
	}{
		{"defaults", []string{"id1"}, nil, "127.0.0.1:7700", "", "", []string{"id1"}},
		{"env", []string{"id1"}, map[string]string{"LEASEHOLD_ADDR": "a:1,b:2", "LEASEHOLD_TOKEN": "tk", "LEASEHOLD_LEASE_TOKEN": "lt"}, "a:1,b:2", "tk", "lt", []string{"id1"}},
		{"flags win", []string{"--addr", "c:3", "id1", "--token", "t2", "--lease-token=lt2"}, map[string]string{"LEASEHOLD_ADDR": "a:1", "LEASEHOLD_TOKEN": "tk", "LEASEHOLD_LEASE_TOKEN": "lt"}, "c:3", "t2", "lt2", []string{"id1"}},
		{"double dash ends flags", []string{"--addr", "c:3", "--", "--id"}, nil, "c:3", "", "", []string{"--id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _, _ := testApp(tt.env)
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			var cf clientFlags
			cf.register(fs)
			lt := fs.String("lease-token", "", "")
			pos, err := a.parse(fs, tt.args, clientEnv("lease-token"), 0)
			if err != nil {
				t.Fatal(err)
			}
			if cf.addr != tt.wantAddr || cf.token != tt.wantToken || *lt != tt.wantLT || !reflect.DeepEqual(pos, tt.wantPos) {
				t.Errorf("addr %q token %q lease-token %q pos %q", cf.addr, cf.token, *lt, pos)
			}
		})
	}
}

func TestParseStopsAfterMaxPositional(t *testing.T) {
	a, _, _ := testApp(nil)
	for _, tt := range []struct {
		args []string
		want []string
		ttl  time.Duration
	}{
		{[]string{"key", "--ttl", "5s", "--", "cmd", "-x", "--ttl", "1s"}, []string{"key", "cmd", "-x", "--ttl", "1s"}, 5 * time.Second},
		{[]string{"--ttl", "5s", "key", "cmd", "-x"}, []string{"key", "cmd", "-x"}, 5 * time.Second},
		{[]string{"key", "cmd", "--ttl", "1s"}, []string{"key", "cmd", "--ttl", "1s"}, 10 * time.Second},
	} {
		fs := flag.NewFlagSet("hold", flag.ContinueOnError)
		ttl := fs.Duration("ttl", 10*time.Second, "")
		got, err := a.parse(fs, tt.args, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, tt.want) || *ttl != tt.ttl {
			t.Errorf("parse(%q) = %q, ttl %v; want %q, ttl %v", tt.args, got, *ttl, tt.want, tt.ttl)
		}
	}
}

func TestRunUsageAndExitCodes(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		inStderr string
		inStdout string
	}{
		{nil, 2, "usage: leasehold", ""},
		{[]string{"help"}, 0, "", "commands:"},
		{[]string{"nope"}, 2, `error: unknown command "nope"`, ""},
		{[]string{"--addr", "h:1", "aquire"}, 2, `unknown command "aquire": did you mean "acquire"?`, ""},
		{[]string{"--json"}, 2, `"code":"USAGE"`, ""},
		{[]string{"--stale", "get", "x"}, 2, "before the command, only the client flags", ""},
		{[]string{"acquire"}, 2, "error: acquire takes one KEY", ""},
		{[]string{"get", "-h"}, 0, "usage: leasehold get", ""},
		{[]string{"get", "--nope", "x"}, 2, "flag provided but not defined", ""},
		{[]string{"renew", "ls_1"}, 2, "--lease-token", ""},
		{[]string{"validate", "--key", "k"}, 2, "validate needs", ""},
		{[]string{"version"}, 0, "", "leasehold "},
		{[]string{"hold", "key"}, 2, "usage: leasehold hold", ""},
		{[]string{"bench", "--workload", "x"}, 2, "--workload", ""},
		{[]string{"session", "frob"}, 2, "usage: leasehold session", ""},
		{[]string{"cluster"}, 2, "usage: leasehold cluster", ""},
		{[]string{"token", "create"}, 2, "--name", ""},
		{[]string{"token", "create", "--name", "x", "--scopes", "root"}, 2, "unknown scope", ""},
		{[]string{"token", "create", "--name", "x", "--scopes", "read", "--write-prefix", "a/"}, 2, "needs the write scope", ""},
		{[]string{"token", "create", "--name", "x", "--scopes", "admin", "--holder", "w"}, 2, "an admin token cannot be restricted", ""},
		{[]string{"token", "create", "--name", "x", "--holder-prefix", ""}, 2, "would match every holder", ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			a, out, errb := testApp(nil)
			code := report(a.run(context.Background(), tt.args), errb)
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.inStderr) {
				t.Errorf("stderr %q does not contain %q", errb.String(), tt.inStderr)
			}
			if !strings.Contains(out.String(), tt.inStdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tt.inStdout)
			}
		})
	}
}

func TestSplitList(t *testing.T) {
	if got := splitList("a:1, b:2,,"); !reflect.DeepEqual(got, []string{"a:1", "b:2"}) {
		t.Fatalf("splitList: %q", got)
	}
	if got := splitList(""); len(got) != 0 {
		t.Fatalf("splitList of nothing: %q", got)
	}
}

// TestTokenFile: --token-file and LEASEHOLD_TOKEN_FILE read the token from
// a file (surrounding space dropped); the last of --token and --token-file
// given wins, a flag over the environment; a file that is empty, holds
// more than one word or cannot be read is a usage error that never quotes
// the file.
func TestTokenFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", "  file-token\n")
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"flag", []string{"--token-file", good}, nil, "file-token", ""},
		{"env", nil, map[string]string{"LEASEHOLD_TOKEN_FILE": good}, "file-token", ""},
		{"env file over env token", nil, map[string]string{"LEASEHOLD_TOKEN": "env-token", "LEASEHOLD_TOKEN_FILE": good}, "file-token", ""},
		{"flag over env file", []string{"--token", "flag-token"}, map[string]string{"LEASEHOLD_TOKEN_FILE": good}, "flag-token", ""},
		{"last flag wins", []string{"--token-file", good, "--token", "flag-token"}, nil, "flag-token", ""},
		{"last flag wins, file", []string{"--token", "flag-token", "--token-file", good}, nil, "file-token", ""},
		{"empty", []string{"--token-file", file("empty", " \n")}, nil, "", "holds no token"},
		{"two words", []string{"--token-file", file("two", "secret-a secret-b\n")}, nil, "", "more than one line or word"},
		{"missing", []string{"--token-file", filepath.Join(dir, "none")}, nil, "", "no such file"},
		{"missing in env", nil, map[string]string{"LEASEHOLD_TOKEN_FILE": filepath.Join(dir, "none")}, "", "LEASEHOLD_TOKEN_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _, errb := testApp(tt.env)
			fs := a.newFlagSet("x", "", "")
			var cf clientFlags
			cf.register(fs)
			_, err := a.parse(fs, tt.args, clientEnv(), 0)
			if tt.wantErr != "" {
				msg := ""
				if err != nil {
					msg = err.Error() + errb.String()
				}
				if err == nil || !strings.Contains(msg, tt.wantErr) || strings.Contains(msg, "secret-") {
					t.Fatalf("error %v (stderr %q), want one saying %q and quoting no content", err, errb, tt.wantErr)
				}
				return
			}
			if err != nil || cf.token != tt.want {
				t.Fatalf("token %q err %v, want %q", cf.token, err, tt.want)
			}
		})
	}
}

// TestTakesNoArguments: each command without arguments refuses one by
// name, before it reaches a server.
func TestTakesNoArguments(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "x"}, "bench takes no arguments"},
		{[]string{"cluster", "status", "x"}, "cluster status takes no arguments"},
		{[]string{"data", "migrate-log", "x"}, "data migrate-log takes no arguments"},
		{[]string{"keys", "x"}, "keys takes no arguments"},
		{[]string{"list", "x"}, "list takes no arguments (use --key or --prefix)"},
		{[]string{"validate", "x"}, "validate takes no arguments"},
		{[]string{"keygen", "x"}, "keygen takes no arguments"},
		{[]string{"session", "create", "x"}, "session create takes no arguments"},
		{[]string{"session", "list", "x"}, "session list takes no arguments"},
		{[]string{"token", "create", "x"}, "token create takes no arguments"},
		{[]string{"watch", "x"}, "watch takes no arguments (use --key or --prefix)"},
	} {
		a, _, _ := testApp(map[string]string{"LEASEHOLD_ADDR": "http://127.0.0.1:1"})
		err := a.run(context.Background(), tt.args)
		var ue *usageError
		if !errors.As(err, &ue) || ue.msg != tt.want {
			t.Errorf("%q: err = %v, want the usage error %q", tt.args, err, tt.want)
		}
	}
}
