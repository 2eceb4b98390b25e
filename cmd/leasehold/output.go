package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// clientFlags are the flags every client subcommand takes.
type clientFlags struct {
	addr    string
	token   string
	json    bool
	timeout time.Duration
	tls     clientTLSFlags
}

// clientEnv lists the variables of the client flags that read the
// environment: --addr, --token, the TLS flags and the extra ones named.
func clientEnv(extra ...string) []envVar {
	return append(append(envVars("addr", "token", "token-file"), clientTLSEnv...), envVars(extra...)...)
}

// newClientFlags registers the client flags on fs.
func newClientFlags(fs *flag.FlagSet) *clientFlags {
	cf := new(clientFlags)
	cf.register(fs)
	return cf
}

func (cf *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.addr, "addr", "127.0.0.1:7700", "comma-separated node addresses (env LEASEHOLD_ADDR)")
	fs.StringVar(&cf.token, "token", "", "bearer token (env LEASEHOLD_TOKEN)")
	fs.Var(&tokenFileFlag{token: &cf.token}, "token-file", "file holding the bearer token, read at start (env LEASEHOLD_TOKEN_FILE); the last of --token and --token-file given wins, either flag over the environment")
	fs.BoolVar(&cf.json, "json", false, "print JSON")
	fs.DurationVar(&cf.timeout, "timeout", 30*time.Second, "bound on each request attempt")
	cf.tls.register(fs)
}

func (cf *clientFlags) client() (*client.Client, error) { return cf.staleClient(false) }

// staleClient is client, with reads answered by the contacted node if
// stale is set.
func (cf *clientFlags) staleClient(stale bool) (*client.Client, error) {
	tc, err := cf.tls.config()
	if err != nil {
		return nil, err
	}
	c, err := client.New(splitList(cf.addr), client.Options{Token: cf.token, Timeout: cf.timeout, StaleReads: stale, TLSConfig: tc})
	if err != nil {
		return nil, usageErrorf("--addr: %v", err)
	}
	return c, nil
}

// tokenFileFlag is --token-file: setting it reads the file into token.
// Errors name the file, never its content.
type tokenFileFlag struct {
	token *string
	path  string
}

func (f *tokenFileFlag) String() string { return f.path }

func (f *tokenFileFlag) Set(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return fmt.Errorf("%s holds no token", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return fmt.Errorf("%s holds more than one line or word; want the token alone", path)
	}
	f.path, *f.token = path, tok
	return nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// metadataFlag collects repeated --metadata k=v.
type metadataFlag map[string]string

func (m metadataFlag) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

func (m metadataFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	m[k] = v
	return nil
}

// millis converts a duration flag to whole milliseconds, rounding up so that
// a positive duration never becomes 0.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func msString(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.String()
}

// randomID returns n random bytes in hex.
func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// kv prints aligned "name  value" lines, skipping empty values.
type kv struct {
	tw *tabwriter.Writer
}

func newKV(w io.Writer) *kv { return &kv{tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)} }

func (p *kv) add(name string, value any) {
	s := fmt.Sprint(value)
	if s == "" || s == "<nil>" {
		return
	}
	fmt.Fprintf(p.tw, "%s\t%s\n", name, s)
}

func (p *kv) flush() error { return p.tw.Flush() }

// life adds the TTL and, while active, the countdown of a lease, session
// or lease group.
func (p *kv) life(state string, ttlMS, remainingMS int64, expiresAt time.Time, heartbeatMS int64) {
	p.add("ttl", msString(ttlMS))
	if state == "active" {
		p.add("remaining", msString(remainingMS))
		p.add("expires_at", timeString(&expiresAt))
		p.add("heartbeat_interval", msString(heartbeatMS))
	}
}

// end adds how a lease or session ended, and its metadata.
func (p *kv) end(endedAt *time.Time, reason string, md map[string]string) {
	p.add("ended_at", timeString(endedAt))
	p.add("end_reason", reason)
	if len(md) > 0 {
		p.add("metadata", metadataFlag(md).String())
	}
}

// table prints rows under a header, aligned, then where a list goes on
// the line that says how to read on.
func table[T any](w io.Writer, header string, rows []T, row func(io.Writer, T), next string) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		row(tw, r)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if next != "" {
		fmt.Fprintf(w, "more: --after %s (or --all)\n", next)
	}
	return nil
}

// printOr prints v as output does, or, when the server answered no body
// (v nil), fallback ({} with --json).
func printOr[T any](w io.Writer, asJSON bool, v *T, fallback string, readable func(io.Writer, *T) error) error {
	if v != nil {
		return output(w, asJSON, v, readable)
	}
	if asJSON {
		return writeJSON(w, struct{}{})
	}
	_, err := fmt.Fprintln(w, fallback)
	return err
}

func timeString(t *time.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.Local().Format(time.RFC3339)
}

// printLease prints a lease readably; the token only where the server
// returned one (the acquire answer).
func printLease(w io.Writer, l *wire.Lease) error {
	p := newKV(w)
	p.add("lease_id", l.LeaseID)
	p.add("key", l.Key)
	p.add("holder", l.Holder)
	p.add("state", l.State)
	p.add("fencing_token", l.FencingToken)
	if l.Limit > 1 {
		p.add("limit", l.Limit)
	}
	p.add("session_id", l.SessionID)
	p.add("group_id", l.GroupID)
	p.life(l.State, l.TTLMS, l.RemainingMS, l.ExpiresAt, l.HeartbeatIntervalMS)
	p.add("acquired_at", timeString(&l.AcquiredAt))
	p.add("last_renewed_at", timeString(l.LastRenewedAt))
	p.add("renewals", l.RenewalCount)
	p.end(l.EndedAt, l.EndReason, l.Metadata)
	p.add("token", l.Token)
	p.add("grant", l.Grant)
	return p.flush()
}

func printSession(w io.Writer, s *wire.Session) error {
	p := newKV(w)
	p.add("session_id", s.SessionID)
	p.add("holder", s.Holder)
	p.add("state", s.State)
	p.life(s.State, s.TTLMS, s.RemainingMS, s.ExpiresAt, s.HeartbeatIntervalMS)
	p.add("created_at", timeString(&s.CreatedAt))
	p.add("last_heartbeat", timeString(s.LastHeartbeat))
	p.add("heartbeats", s.HeartbeatCount)
	p.end(s.EndedAt, s.EndReason, s.Metadata)
	p.add("leases", strings.Join(s.LeaseIDs, " "))
	p.add("token", s.Token)
	return p.flush()
}

// output prints v as JSON with --json, else with the readable printer.
func output[T any](w io.Writer, asJSON bool, v T, readable func(io.Writer, T) error) error {
	if asJSON {
		return writeJSON(w, v)
	}
	return readable(w, v)
}
