package main

// Credentials the server re-reads while it runs: the tokens file, the CA
// bundles of the API's client certificates and of Raft, and the
// certificates themselves. Each is re-read on SIGHUP and when its files'
// content changes (polled every --reload-interval). New content that does
// not load keeps the old, is logged at error and counted.

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/prometheus/client_golang/prometheus"
)

// defaultReloadInterval is how often the server checks whether a
// credential file changed.
const defaultReloadInterval = 5 * time.Second

// caBundle is a CA bundle read from a file, replaced as a whole by a
// successful reload.
type caBundle struct {
	flag, path string
	cur        atomic.Pointer[x509.CertPool]
	expiry     atomic.Int64 // earliest NotAfter of the bundle, Unix seconds
}

func loadCABundle(flagName, path string) (*caBundle, error) {
	b := &caBundle{flag: flagName, path: path}
	if err := b.reload(); err != nil {
		return nil, err
	}
	return b, nil
}

// pool is the bundle as last loaded.
func (b *caBundle) pool() *x509.CertPool { return b.cur.Load() }

// reload re-reads the file; on failure the previous bundle stays.
func (b *caBundle) reload() error {
	pool, earliest, err := readCAs(b.flag, b.path)
	if err != nil {
		return err
	}
	b.cur.Store(pool)
	b.expiry.Store(earliest.Unix())
	return nil
}

// notAfter is the earliest expiry among the key pair's certificates (the
// leaf and the intermediates it sends).
func (kp *keyPair) notAfter() time.Time {
	kp.mu.Lock()
	cert := kp.cert
	kp.mu.Unlock()
	earliest := cert.Leaf.NotAfter
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil && c.NotAfter.Before(earliest) {
			earliest = c.NotAfter
		}
	}
	return earliest
}

// reloadable is one thing the reloader re-reads: what names it in logs
// and metrics, files are what it is read from, load reads them and
// installs what they hold (keeping the old on error).
type reloadable struct {
	what  string
	files []string
	load  func() error
	// sum is the digest of the files' content (or of why they could not
	// be read) at the last attempt.
	sum [sha256.Size]byte
}

// digest hashes the current content of the files; an unreadable file
// hashes as its error, so a file that disappears counts as a change once.
func (r *reloadable) digest() [sha256.Size]byte {
	h := sha256.New()
	for _, f := range r.files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(h, "error %s\x00", err)
			continue
		}
		fmt.Fprintf(h, "%d\x00", len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// reloader re-reads the server's credentials.
type reloader struct {
	log   *slog.Logger
	items []*reloadable
	ok    *prometheus.CounterVec
	fail  *prometheus.CounterVec
}

// newReloader lists what the server can reload: the tokens (nil: auth is
// off, which a reload does not turn on), and what sec holds.
func newReloader(tokensFile string, tokens *api.Tokens, sec *serverTLS, log *slog.Logger) *reloader {
	r := &reloader{
		log: log.With("component", "reload"),
		ok: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_reloads_total",
			Help: "Credential reloads that succeeded (on SIGHUP or a changed file), by what was reloaded: tokens, api_cert, raft_cert, api_client_ca, raft_ca.",
		}, []string{"what"}),
		fail: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_reload_errors_total",
			Help: "Credential reloads that failed and kept the previous content, by what was reloaded: tokens, api_cert, raft_cert, api_client_ca, raft_ca.",
		}, []string{"what"}),
	}
	if tokens != nil {
		r.add("tokens", []string{tokensFile}, func() error {
			t, err := api.LoadTokens(tokensFile)
			if err != nil {
				return err
			}
			tokens.Replace(t)
			return nil
		})
	}
	if kp := sec.httpPair; kp != nil {
		r.add("api_cert", []string{kp.certFile, kp.keyFile}, kp.reload)
	}
	if kp := sec.raftPair; kp != nil && kp != sec.httpPair {
		r.add("raft_cert", []string{kp.certFile, kp.keyFile}, kp.reload)
	}
	if b := sec.clientCA; b != nil {
		r.add("api_client_ca", []string{b.path}, b.reload)
	}
	if b := sec.raftCA; b != nil {
		r.add("raft_ca", []string{b.path}, b.reload)
	}
	return r
}

func (r *reloader) add(what string, files []string, load func() error) {
	it := &reloadable{what: what, files: files, load: load}
	it.sum = it.digest() // loaded at start
	r.items = append(r.items, it)
	r.ok.WithLabelValues(what)
	r.fail.WithLabelValues(what)
}

// reload re-reads every item (force: SIGHUP) or those whose files changed.
func (r *reloader) reload(force bool) {
	for _, it := range r.items {
		sum := it.digest()
		if !force && sum == it.sum {
			continue
		}
		it.sum = sum
		if err := it.load(); err != nil {
			r.fail.WithLabelValues(it.what).Inc()
			r.log.Error("reload failed; keeping the previous content", "what", it.what, "err", err)
			continue
		}
		r.ok.WithLabelValues(it.what).Inc()
		r.log.Info("reloaded", "what", it.what, "files", it.files)
	}
}

// run reloads on every SIGHUP and, every interval (0: never), what
// changed, until ctx ends or the returned stop is called.
func (r *reloader) run(ctx context.Context, interval time.Duration) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var tick <-chan time.Time
		if interval > 0 {
			t := time.NewTicker(interval)
			defer t.Stop()
			tick = t.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				r.log.Info("SIGHUP: reloading credentials")
				r.reload(true)
			case <-tick:
				r.reload(false)
			}
		}
	}()
	return func() {
		cancel()
		signal.Stop(hup)
		<-done
	}
}

// register adds the reload counters and the certificate expiry gauges to
// reg.
func (r *reloader) register(reg *prometheus.Registry, sec *serverTLS) {
	reg.MustRegister(r.ok, r.fail, certExpiry{sec})
}

// certExpiry exposes, at each scrape, the seconds until the earliest
// expiry among each loaded certificate set.
type certExpiry struct{ sec *serverTLS }

var certExpiryDesc = prometheus.NewDesc("leasehold_certificate_expiry_seconds",
	"Seconds until the earliest expiry among the certificates loaded (negative: expired), by cert: api, raft (this server's, with their intermediates), api_client_ca, raft_ca (the CA bundles).",
	[]string{"cert"}, nil)

func (c certExpiry) Describe(ch chan<- *prometheus.Desc) { ch <- certExpiryDesc }

func (c certExpiry) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	emit := func(name string, t time.Time) {
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, t.Sub(now).Seconds(), name)
	}
	if kp := c.sec.httpPair; kp != nil {
		emit("api", kp.notAfter())
	}
	if kp := c.sec.raftPair; kp != nil {
		emit("raft", kp.notAfter())
	}
	if b := c.sec.clientCA; b != nil {
		emit("api_client_ca", time.Unix(b.expiry.Load(), 0))
	}
	if b := c.sec.raftCA; b != nil {
		emit("raft_ca", time.Unix(b.expiry.Load(), 0))
	}
}
