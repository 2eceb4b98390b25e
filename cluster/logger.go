package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// slogHC is hclog.Logger over slog: what hashicorp/raft, raft-wal and
// autopilot log keeps its key/value pairs as slog attributes (fields of
// their own with --log-format json, not text inside msg). The logger's name
// is the attribute component. Lines below the level (default Info, as
// those libraries' Debug and Trace are chatty) are dropped.
type slogHC struct {
	l       *slog.Logger // with component and the implied args
	base    *slog.Logger // without them (ResetNamed, Named)
	name    string
	implied []any
	level   *atomic.Int32 // an hclog.Level, shared with the loggers made from this one
}

// newHCLogger adapts l for hashicorp libraries that log through hclog,
// under the component name.
func newHCLogger(name string, l *slog.Logger) hclog.Logger {
	lv := new(atomic.Int32)
	lv.Store(int32(hclog.Info))
	return newSlogHC(l, name, nil, lv)
}

func newSlogHC(base *slog.Logger, name string, implied []any, level *atomic.Int32) *slogHC {
	l := base
	if name != "" {
		l = l.With("component", name)
	}
	if len(implied) > 0 {
		l = l.With(attrs(implied)...)
	}
	return &slogHC{l: l, base: base, name: name, implied: implied, level: level}
}

// HCLogger adapts l for hashicorp libraries that log through hclog.
func HCLogger(name string, l *slog.Logger) hclog.Logger { return newHCLogger(name, l) }

// slogLevel maps an hclog level to slog's (Trace below Debug).
func slogLevel(lv hclog.Level) slog.Level {
	switch lv {
	case hclog.Trace:
		return slog.LevelDebug - 4
	case hclog.Debug:
		return slog.LevelDebug
	case hclog.Warn:
		return slog.LevelWarn
	case hclog.Error:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// attrs turns hclog's alternating keys and values into slog attributes: an
// error becomes its message, hclog.Format its formatted text, a value
// without a key is kept under EXTRA_VALUE_AT_END (as hclog does).
func attrs(args []any) []any {
	out := make([]any, 0, len(args)/2+1)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			out = append(out, slog.Any("EXTRA_VALUE_AT_END", value(args[i])))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprint(args[i])
		}
		out = append(out, slog.Any(key, value(args[i+1])))
	}
	return out
}

func value(v any) any {
	switch v := v.(type) {
	case hclog.Format:
		if len(v) == 0 {
			return ""
		}
		if f, ok := v[0].(string); ok {
			return fmt.Sprintf(f, v[1:]...)
		}
		return fmt.Sprint(v...)
	case error:
		if v == nil {
			return nil
		}
		return v.Error()
	}
	return v
}

func (h *slogHC) enabled(lv hclog.Level) bool {
	return lv >= hclog.Level(h.level.Load()) && h.l.Enabled(context.Background(), slogLevel(lv))
}

func (h *slogHC) Log(lv hclog.Level, msg string, args ...any) {
	if lv == hclog.Off || lv == hclog.NoLevel {
		lv = hclog.Info
	}
	if !h.enabled(lv) {
		return
	}
	h.l.Log(context.Background(), slogLevel(lv), msg, attrs(args)...)
}

func (h *slogHC) Trace(msg string, args ...any) { h.Log(hclog.Trace, msg, args...) }
func (h *slogHC) Debug(msg string, args ...any) { h.Log(hclog.Debug, msg, args...) }
func (h *slogHC) Info(msg string, args ...any)  { h.Log(hclog.Info, msg, args...) }
func (h *slogHC) Warn(msg string, args ...any)  { h.Log(hclog.Warn, msg, args...) }
func (h *slogHC) Error(msg string, args ...any) { h.Log(hclog.Error, msg, args...) }

func (h *slogHC) IsTrace() bool { return h.enabled(hclog.Trace) }
func (h *slogHC) IsDebug() bool { return h.enabled(hclog.Debug) }
func (h *slogHC) IsInfo() bool  { return h.enabled(hclog.Info) }
func (h *slogHC) IsWarn() bool  { return h.enabled(hclog.Warn) }
func (h *slogHC) IsError() bool { return h.enabled(hclog.Error) }

func (h *slogHC) ImpliedArgs() []any { return h.implied }

func (h *slogHC) With(args ...any) hclog.Logger {
	return newSlogHC(h.base, h.name, append(append([]any(nil), h.implied...), args...), h.level)
}

func (h *slogHC) Name() string { return h.name }

func (h *slogHC) Named(name string) hclog.Logger {
	if h.name != "" {
		name = h.name + "." + name
	}
	return newSlogHC(h.base, name, h.implied, h.level)
}

func (h *slogHC) ResetNamed(name string) hclog.Logger {
	return newSlogHC(h.base, name, h.implied, h.level)
}

func (h *slogHC) SetLevel(lv hclog.Level) { h.level.Store(int32(lv)) }
func (h *slogHC) GetLevel() hclog.Level   { return hclog.Level(h.level.Load()) }

func (h *slogHC) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter takes lines of the standard log package, each at the
// level of its "[LEVEL]" prefix (Info without one).
func (h *slogHC) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return &stdLogWriter{h: h}
}

type stdLogWriter struct{ h *slogHC }

func (w *stdLogWriter) Write(p []byte) (int, error) {
	lv, msg := parseStdLine(p)
	w.h.Log(lv, msg)
	return len(p), nil
}

// parseStdLine reads the level prefix of a line of the standard log
// package as hashicorp libraries write them ("[WARN] memberlist: msg"),
// dropping the prefix and the library's "name: " after it.
func parseStdLine(p []byte) (hclog.Level, string) {
	msg := bytes.TrimSpace(p)
	lv := hclog.Info
	if len(msg) > 0 && msg[0] == '[' {
		if end := bytes.IndexByte(msg, ']'); end > 0 {
			switch string(msg[1:end]) {
			case "TRACE":
				lv = hclog.Trace
			case "DEBUG":
				lv = hclog.Debug
			case "INFO":
				lv = hclog.Info
			case "WARN", "WARNING":
				lv = hclog.Warn
			case "ERR", "ERROR":
				lv = hclog.Error
			default:
				return lv, string(msg)
			}
			msg = bytes.TrimSpace(msg[end+1:])
		}
	}
	if rest, ok := bytes.CutPrefix(msg, []byte("memberlist: ")); ok {
		msg = rest
	}
	return lv, string(msg)
}
