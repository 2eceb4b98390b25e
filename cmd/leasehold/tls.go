package main

// Transport security flags: TLS for the HTTP API and its clients, mutual
// TLS for Raft, the gossip key, and the refusal to serve plaintext beyond
// loopback. Files are read here; errors name the flag, the file and the
// problem, never the content.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"io/fs"
	stdlog "log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/cluster"
)

// serverTLSFlags are the server's transport security flags.
type serverTLSFlags struct {
	cert, key         string // --tls-cert, --tls-key
	clientCA          string // --tls-client-ca
	clientAuth        string // --tls-client-auth: require or verify-if-given
	ca                string // --tls-ca: verifies the leader when forwarding
	raftCert, raftKey string // --raft-tls-cert, --raft-tls-key
	raftCA            string // --raft-tls-ca
	gossipKey         string // --gossip-key (base64)
	gossipKeyFile     string // --gossip-key-file
	insecure          bool   // --insecure-plaintext
}

func (f *serverTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.cert, "tls-cert", "", "PEM certificate (chain) of the HTTP API; with --tls-key turns on HTTPS. Reloaded on SIGHUP and when the file changes")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.clientCA, "tls-client-ca", "", "PEM CA bundle verifying client certificates (see --tls-client-auth)")
	fs.StringVar(&f.clientAuth, "tls-client-auth", "require", "with --tls-client-ca: require a client certificate, or verify-if-given")
	fs.StringVar(&f.ca, "tls-ca", "", "PEM CA bundle verifying the leader's HTTP certificate when forwarding (default: the system roots)")
	fs.StringVar(&f.raftCert, "raft-tls-cert", "", "PEM certificate for Raft mutual TLS (default with --raft-tls-ca: --tls-cert)")
	fs.StringVar(&f.raftKey, "raft-tls-key", "", "PEM private key of --raft-tls-cert (default with --raft-tls-ca: --tls-key)")
	fs.StringVar(&f.raftCA, "raft-tls-ca", "", "PEM CA bundle of the cluster's servers; turns on mutual TLS for Raft")
	fs.StringVar(&f.gossipKey, "gossip-key", "", "gossip encryption key: base64 of 16, 24 or 32 random bytes, the same on every server (prefer the environment or --gossip-key-file)")
	fs.StringVar(&f.gossipKeyFile, "gossip-key-file", "", "file holding the base64 gossip key")
	fs.BoolVar(&f.insecure, "insecure-plaintext", false, "allow binding a non-loopback address without HTTPS, Raft TLS or a gossip key")
}

// check reports flag combinations that cannot work, as usage errors.
func (f *serverTLSFlags) check() error {
	if (f.cert == "") != (f.key == "") {
		return usageErrorf("--tls-cert and --tls-key go together")
	}
	if f.clientCA != "" && f.cert == "" {
		return usageErrorf("--tls-client-ca needs --tls-cert and --tls-key (client certificates are a TLS feature)")
	}
	switch f.clientAuth {
	case "require", "verify-if-given":
	default:
		return usageErrorf("--tls-client-auth %q: want require or verify-if-given", f.clientAuth)
	}
	if (f.raftCert == "") != (f.raftKey == "") {
		return usageErrorf("--raft-tls-cert and --raft-tls-key go together")
	}
	if f.raftCert != "" && f.raftCA == "" {
		return usageErrorf("--raft-tls-cert needs --raft-tls-ca (the CA every server's Raft certificate must chain to)")
	}
	if f.raftCA != "" && f.raftCert == "" && f.cert == "" {
		return usageErrorf("--raft-tls-ca needs a certificate: --raft-tls-cert and --raft-tls-key, or --tls-cert and --tls-key")
	}
	if f.gossipKey != "" && f.gossipKeyFile != "" {
		return usageErrorf("give --gossip-key or --gossip-key-file, not both")
	}
	return nil
}

// serverTLS is what the flags amount to once the files are read.
type serverTLS struct {
	http      *tls.Config // nil: plain HTTP
	forward   *tls.Config // nil: forward over plain HTTP
	raft      *cluster.TLSConfig
	gossipKey []byte
	// What the server re-reads while it runs (reload.go); nil: not
	// configured. raftPair is httpPair when Raft reuses the API's pair.
	httpPair, raftPair *keyPair
	clientCA, raftCA   *caBundle
}

// load reads every file the flags name.
func (f *serverTLSFlags) load(log *slog.Logger) (*serverTLS, error) {
	out := &serverTLS{}
	if f.cert != "" {
		kp, err := loadKeyPair("--tls-cert", f.cert, "--tls-key", f.key, log)
		if err != nil {
			return nil, err
		}
		out.httpPair = kp
		var clientCAs *x509.CertPool
		if f.clientCA != "" {
			if out.clientCA, err = loadCABundle("--tls-client-ca", f.clientCA); err != nil {
				return nil, err
			}
			clientCAs = out.clientCA.pool()
		}
		out.http = api.ServerTLS(kp.getCertificate, clientCAs, f.clientAuth == "require")
		if out.clientCA != nil {
			// Each handshake verifies client certificates against the
			// bundle as last (re)loaded.
			base, bundle := out.http.Clone(), out.clientCA
			out.http.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
				c := base.Clone()
				c.ClientCAs = bundle.pool()
				return c, nil
			}
		}
		var roots *x509.CertPool
		if f.ca != "" {
			if roots, err = loadCAs("--tls-ca", f.ca); err != nil {
				return nil, err
			}
		}
		// The node's own certificate answers a leader that requires client
		// certificates.
		out.forward = api.ClientTLS(roots, kp.getClientCertificate)
	}
	if f.raftCA != "" {
		cas, err := loadCABundle("--raft-tls-ca", f.raftCA)
		if err != nil {
			return nil, err
		}
		out.raftCA = cas
		kp := out.httpPair
		if f.raftCert != "" {
			if kp, err = loadKeyPair("--raft-tls-cert", f.raftCert, "--raft-tls-key", f.raftKey, log); err != nil {
				return nil, err
			}
		}
		out.raftPair = kp
		out.raft = &cluster.TLSConfig{Certificate: kp.current, CAs: cas.pool(), CurrentCAs: cas.pool}
	}
	switch {
	case f.gossipKey != "":
		k, err := decodeGossipKey(f.gossipKey)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key: %w", err)
		}
		out.gossipKey = k
	case f.gossipKeyFile != "":
		b, err := os.ReadFile(f.gossipKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		k, err := decodeGossipKey(string(b))
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file %s: %w", f.gossipKeyFile, err)
		}
		warnIfReadable(log, "--gossip-key-file", f.gossipKeyFile)
		out.gossipKey = k
	}
	return out, nil
}

// decodeGossipKey decodes a base64 gossip key. Errors never include the
// key.
func decodeGossipKey(s string) ([]byte, error) {
	return decodeKey(s, "head -c 32 /dev/urandom | base64", 16, 24, 32)
}

// decodeKey decodes a base64 key (padded or not, surrounding space
// ignored) of one of the sizes given; gen says how to make one. Errors
// never include the key.
func decodeKey(s, gen string, sizes ...int) ([]byte, error) {
	s = strings.TrimSpace(s)
	k, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		if k, err = base64.RawStdEncoding.DecodeString(s); err != nil {
			return nil, fmt.Errorf("not valid base64 (generate a key with: %s)", gen)
		}
	}
	if slices.Contains(sizes, len(k)) {
		return k, nil
	}
	want := fmt.Sprint(sizes[len(sizes)-1])
	if len(sizes) > 1 {
		parts := make([]string, len(sizes)-1)
		for i, n := range sizes[:len(sizes)-1] {
			parts[i] = fmt.Sprint(n)
		}
		want = strings.Join(parts, ", ") + " or " + want
	}
	return nil, fmt.Errorf("decodes to %d bytes; want %s (generate a key with: %s)", len(k), want, gen)
}

// plaintextRefusal returns the error a server gets for binding a
// non-loopback address without protecting what runs on it, unless
// --insecure-plaintext is given, in which case it returns the list of what
// stays plaintext (for a warning).
func plaintextRefusal(httpAddr, raftAddr, gossipAddr string, f *serverTLSFlags) (exposed []string, err error) {
	if !isLoopback(httpAddr) && f.cert == "" {
		exposed = append(exposed, fmt.Sprintf("HTTP API on %s without TLS (--tls-cert, --tls-key)", httpAddr))
	}
	if !isLoopback(raftAddr) && f.raftCA == "" {
		exposed = append(exposed, fmt.Sprintf("Raft on %s without mutual TLS (--raft-tls-ca and a certificate)", raftAddr))
	}
	if !isLoopback(gossipAddr) && f.gossipKey == "" && f.gossipKeyFile == "" {
		exposed = append(exposed, fmt.Sprintf("gossip on %s without encryption (--gossip-key or --gossip-key-file)", gossipAddr))
	}
	if len(exposed) == 0 || f.insecure {
		return exposed, nil
	}
	return exposed, fmt.Errorf("refusing to serve plaintext beyond loopback:\n  %s\n"+
		"configure them (see docs/security.md), or pass --insecure-plaintext (LEASEHOLD_INSECURE_PLAINTEXT=true) "+
		"on a network where everyone who can reach these ports is trusted", strings.Join(exposed, "\n  "))
}

// isLoopback reports whether a bind address listens on loopback only: a
// loopback IP, or localhost. An empty or unspecified host, and any other
// name, count as reachable from the network.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// keyPair is a certificate and its key read from files. It is re-read when
// reload is called (SIGHUP) or when a handshake finds either file's
// modification time changed (checked at most once a second); a failed
// re-read keeps the previous pair and is logged.
type keyPair struct {
	certFlag, certFile string
	keyFlag, keyFile   string
	log                *slog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	certMod   time.Time
	keyMod    time.Time
	lastCheck time.Time
}

func loadKeyPair(certFlag, certFile, keyFlag, keyFile string, log *slog.Logger) (*keyPair, error) {
	kp := &keyPair{certFlag: certFlag, certFile: certFile, keyFlag: keyFlag, keyFile: keyFile, log: log}
	if err := kp.reload(); err != nil {
		return nil, err
	}
	warnIfReadable(log, keyFlag, keyFile)
	return kp, nil
}

// read reads and checks both files.
func (kp *keyPair) read() (*tls.Certificate, time.Time, time.Time, error) {
	var zero time.Time
	certPEM, certMod, err := readFile(kp.certFlag, kp.certFile)
	if err != nil {
		return nil, zero, zero, err
	}
	keyPEM, keyMod, err := readFile(kp.keyFlag, kp.keyFile)
	if err != nil {
		return nil, zero, zero, err
	}
	if !hasPEM(certPEM, func(t string) bool { return t == "CERTIFICATE" }) {
		return nil, zero, zero, fmt.Errorf("%s %s: no PEM certificate in the file", kp.certFlag, kp.certFile)
	}
	if !hasPEM(keyPEM, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") }) {
		return nil, zero, zero, fmt.Errorf("%s %s: no PEM private key in the file", kp.keyFlag, kp.keyFile)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// crypto/tls's messages describe the problem, never the key.
		return nil, zero, zero, fmt.Errorf("%s %s with %s %s: %v", kp.certFlag, kp.certFile, kp.keyFlag, kp.keyFile, err)
	}
	if now := time.Now(); now.After(cert.Leaf.NotAfter) {
		return nil, zero, zero, fmt.Errorf("%s %s: the certificate expired on %s", kp.certFlag, kp.certFile, cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	} else if now.Before(cert.Leaf.NotBefore) {
		return nil, zero, zero, fmt.Errorf("%s %s: the certificate is not valid before %s", kp.certFlag, kp.certFile, cert.Leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return &cert, certMod, keyMod, nil
}

// reload re-reads the files now; on failure the previous pair stays.
func (kp *keyPair) reload() error {
	cert, certMod, keyMod, err := kp.read()
	kp.mu.Lock()
	defer kp.mu.Unlock()
	kp.lastCheck = time.Now()
	if err != nil {
		return err
	}
	kp.cert, kp.certMod, kp.keyMod = cert, certMod, keyMod
	return nil
}

// current returns the pair, re-reading the files first if they changed.
func (kp *keyPair) current() (*tls.Certificate, error) {
	kp.mu.Lock()
	stale := time.Since(kp.lastCheck) >= time.Second
	if stale {
		kp.lastCheck = time.Now()
	}
	cert, certMod, keyMod := kp.cert, kp.certMod, kp.keyMod
	kp.mu.Unlock()
	if stale && (modTime(kp.certFile) != certMod || modTime(kp.keyFile) != keyMod) {
		if err := kp.reload(); err != nil {
			kp.log.Error("certificate files changed but cannot be loaded; keeping the previous certificate", "err", err)
		} else {
			kp.log.Info("certificate reloaded", "cert", kp.certFile)
			kp.mu.Lock()
			cert = kp.cert
			kp.mu.Unlock()
		}
	}
	return cert, nil
}

func (kp *keyPair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return kp.current()
}

func (kp *keyPair) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return kp.current()
}

func modTime(path string) time.Time {
	st, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return st.ModTime()
}

func readFile(flagName, path string) ([]byte, time.Time, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", flagName, err)
	}
	if !st.Mode().IsRegular() {
		return nil, time.Time{}, fmt.Errorf("%s %s: not a regular file", flagName, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("%s: %w", flagName, err)
	}
	return b, st.ModTime(), nil
}

// hasPEM reports whether b holds a PEM block whose type is accepted.
func hasPEM(b []byte, accept func(string) bool) bool {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return false
		}
		if accept(block.Type) {
			return true
		}
	}
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(flagName, path string) (*x509.CertPool, error) {
	pool, _, err := readCAs(flagName, path)
	return pool, err
}

// readCAs reads a PEM bundle of CA certificates and returns the earliest
// expiry among them.
func readCAs(flagName, path string) (*x509.CertPool, time.Time, error) {
	b, _, err := readFile(flagName, path)
	if err != nil {
		return nil, time.Time{}, err
	}
	pool := x509.NewCertPool()
	var earliest time.Time
	n := 0
	for i := 1; ; i++ {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("%s %s: certificate %d: %v", flagName, path, i, err)
		}
		pool.AddCert(c)
		if n == 0 || c.NotAfter.Before(earliest) {
			earliest = c.NotAfter
		}
		n++
	}
	if n == 0 {
		return nil, time.Time{}, fmt.Errorf("%s %s: no PEM certificate in the file", flagName, path)
	}
	return pool, earliest, nil
}

// warnIfReadable logs a warning when a secret file is readable by others
// (group-readable is the usual root:leasehold 0640).
func warnIfReadable(log *slog.Logger, flagName, path string) {
	st, err := os.Stat(path)
	if err == nil && st.Mode().Perm()&0o007 != 0 {
		log.Warn("secret file is readable by every user; chmod 0600 (or 0640 with a group of the server's user)",
			"flag", flagName, "file", path, "mode", fs.FileMode(st.Mode().Perm()).String())
	}
}

// clientTLSFlags are the client subcommands' TLS flags.
type clientTLSFlags struct {
	ca, cert, key string
}

func (f *clientTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.ca, "tls-ca", "", "PEM CA bundle verifying the server (env LEASEHOLD_CLIENT_CA; default: the system roots); any --tls-* flag makes host:port addresses https")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM client certificate, for servers that require one (env LEASEHOLD_CLIENT_CERT)")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of --tls-cert (env LEASEHOLD_CLIENT_KEY)")
}

// clientTLSEnv are the variables of the client TLS flags. They are not
// the server's LEASEHOLD_TLS_* (its own certificate, in the environment of
// a server's container or unit, where a client command must not present
// it); those old names are still read, with a deprecation warning, while
// none of the new ones is set.
var clientTLSEnv = []envVar{
	{flag: "tls-ca", name: "LEASEHOLD_CLIENT_CA", old: "LEASEHOLD_TLS_CA"},
	{flag: "tls-cert", name: "LEASEHOLD_CLIENT_CERT", old: "LEASEHOLD_TLS_CERT"},
	{flag: "tls-key", name: "LEASEHOLD_CLIENT_KEY", old: "LEASEHOLD_TLS_KEY"},
}

// config returns the client TLS configuration, nil when no flag is set.
func (f *clientTLSFlags) config() (*tls.Config, error) {
	if f.ca == "" && f.cert == "" && f.key == "" {
		return nil, nil
	}
	if (f.cert == "") != (f.key == "") {
		return nil, usageErrorf("--tls-cert and --tls-key go together")
	}
	var roots *x509.CertPool
	if f.ca != "" {
		var err error
		if roots, err = loadCAs("--tls-ca", f.ca); err != nil {
			return nil, err
		}
	}
	var getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	if f.cert != "" {
		kp := &keyPair{certFlag: "--tls-cert", certFile: f.cert, keyFlag: "--tls-key", keyFile: f.key}
		cert, _, _, err := kp.read()
		if err != nil {
			return nil, err
		}
		getCert = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return api.ClientTLS(roots, getCert), nil
}

// httpErrorLog is the HTTP server's error log: warnings, except that
// failed TLS handshakes (anyone can cause one per connection) are logged
// at most once a second, with the count of those not logged since.
func httpErrorLog(log *slog.Logger) *stdlog.Logger {
	return stdlog.New(&handshakeLogLimiter{log: log}, "", 0)
}

type handshakeLogLimiter struct {
	log *slog.Logger

	mu    sync.Mutex
	last  time.Time
	quiet int64
}

func (w *handshakeLogLimiter) Write(b []byte) (int, error) {
	msg := strings.TrimSpace(string(b))
	if strings.Contains(msg, "TLS handshake error") {
		w.mu.Lock()
		now := time.Now()
		if now.Sub(w.last) < time.Second {
			w.quiet++
			w.mu.Unlock()
			return len(b), nil
		}
		quiet := w.quiet
		w.last, w.quiet = now, 0
		w.mu.Unlock()
		w.log.Warn(msg, "not_logged_before", quiet)
		return len(b), nil
	}
	w.log.Warn(msg)
	return len(b), nil
}
