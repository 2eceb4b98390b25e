package cluster

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// jsonLines decodes the JSON log lines in buf.
func jsonLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestHCLoggerFields: what raft logs through hclog keeps its key/value
// pairs as fields of the JSON line, with its level, its component and the
// pairs of With; Debug and Trace are dropped by default.
func TestHCLoggerFields(t *testing.T) {
	var buf bytes.Buffer
	base := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := newHCLogger("raft", base)

	h.Warn("failed to contact", "server-id", "n2", "term", 3, "error", errors.New("dial tcp: refused"))
	h.With("id", "n1").Named("pipeline").Error("append failed", "index", uint64(7), hclog.Format{"%d entries", 4})
	h.Info("odd", "lonely")
	h.Debug("chatty", "k", "v")
	h.Trace("chattier")
	if h.IsDebug() || !h.IsInfo() {
		t.Fatalf("IsDebug %v IsInfo %v, want false and true", h.IsDebug(), h.IsInfo())
	}
	h.SetLevel(hclog.Debug)
	h.Debug("now shown", "k", "v")

	lines := jsonLines(t, &buf)
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), buf.String())
	}
	want := []map[string]any{
		{"level": "WARN", "msg": "failed to contact", "component": "raft", "server-id": "n2", "term": float64(3), "error": "dial tcp: refused"},
		{"level": "ERROR", "msg": "append failed", "component": "raft.pipeline", "id": "n1", "index": float64(7)},
		{"level": "INFO", "msg": "odd", "EXTRA_VALUE_AT_END": "lonely"},
		{"level": "DEBUG", "msg": "now shown", "k": "v"},
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v (line %v)", i, k, lines[i][k], v, lines[i])
			}
		}
	}
	if got := lines[1]["%d entries"]; got != nil {
		t.Errorf("hclog.Format used as a key: %v", lines[1])
	}
	if !strings.Contains(buf.String(), `"4 entries"`) {
		t.Errorf("hclog.Format not formatted: %s", buf.String())
	}
}

// TestStdLogLines: memberlist's standard-log lines become records at their
// level, without the "[LEVEL] memberlist: " prefix.
func TestStdLogLines(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	w := &memberlistLog{l: l}
	for _, line := range []string{
		"[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed\n",
		"[ERR] memberlist: Failed to send ping: write: refused\n",
		"[DEBUG] memberlist: Stream connection from=127.0.0.1:4000\n",
		"no prefix at all\n",
	} {
		w.Write([]byte(line))
	}
	lines := jsonLines(t, &buf)
	want := [][2]string{
		{"WARN", "Was able to connect to n2 over TCP but UDP probes failed"},
		{"ERROR", "Failed to send ping: write: refused"},
		{"DEBUG", "Stream connection from=127.0.0.1:4000"},
		{"INFO", "no prefix at all"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if lines[i]["level"] != w[0] || lines[i]["msg"] != w[1] || lines[i]["component"] != "gossip" {
			t.Errorf("line %d: %v, want level %s msg %q component gossip", i, lines[i], w[0], w[1])
		}
	}
	// The standard logger an hclog user asks for parses the same way.
	buf.Reset()
	newHCLogger("transport", l).StandardLogger(nil).Print("[ERR] raft-net: failed to accept connection")
	lines = jsonLines(t, &buf)
	if len(lines) != 1 || lines[0]["level"] != "ERROR" || lines[0]["msg"] != "raft-net: failed to accept connection" {
		t.Fatalf("standard logger line: %v", lines)
	}
}
