package cluster

import (
	"bytes"
	"context"
	"log/slog"

	"github.com/hashicorp/go-hclog"
)

// newHCLogger adapts slog for hashicorp/raft: hclog writes text lines that
// this writer forwards to slog at the matching level.
func newHCLogger(name string, l *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:            name,
		Level:           hclog.Info,
		Output:          &slogWriter{l: l.With("component", name)},
		DisableTime:     true,
		IncludeLocation: false,
	})
}

type slogWriter struct{ l *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	msg := bytes.TrimSpace(p)
	level := slog.LevelInfo
	switch {
	case bytes.HasPrefix(msg, []byte("[ERROR]")):
		level = slog.LevelError
	case bytes.HasPrefix(msg, []byte("[WARN]")):
		level = slog.LevelWarn
	case bytes.HasPrefix(msg, []byte("[DEBUG]")), bytes.HasPrefix(msg, []byte("[TRACE]")):
		level = slog.LevelDebug
	}
	if i := bytes.IndexByte(msg, ' '); i > 0 && msg[0] == '[' {
		msg = bytes.TrimSpace(msg[i:])
	}
	w.l.Log(context.Background(), level, string(msg))
	return len(p), nil
}

// HCLogger adapts l for hashicorp libraries that log through hclog.
func HCLogger(name string, l *slog.Logger) hclog.Logger { return newHCLogger(name, l) }
