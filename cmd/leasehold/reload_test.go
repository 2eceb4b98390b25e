package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testpki"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestReloadCABundles: the API's client CA bundle and the Raft CA bundle
// are re-read when their file changes: a client certificate of a CA added
// to the bundle is accepted from then on, a broken bundle keeps the
// previous one and is counted, and the expiry gauges follow what is
// loaded.
func TestReloadCABundles(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := testpki.NewCA(t, "ca-one"), testpki.NewCA(t, "ca-two")
	srv := ca1.WriteFiles(dir, "server", ca1.Issue("server"))
	bundle := filepath.Join(dir, "bundle.pem")
	write := func(b ...[]byte) {
		var all []byte
		for _, p := range b {
			all = append(all, p...)
		}
		if err := os.WriteFile(bundle, all, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(ca1.PEM)
	flags := serverTLSFlags{cert: srv.Cert, key: srv.Key, clientCA: bundle, clientAuth: "require", raftCA: bundle}
	log := slog.New(slog.DiscardHandler)
	sec, err := flags.load(log)
	if err != nil {
		t.Fatal(err)
	}
	r := newReloader("", nil, sec, log)
	reg := prometheus.NewRegistry()
	r.register(reg, sec)

	ln, err := tls.Listen("tcp", "127.0.0.1:0", sec.http)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.(*tls.Conn).Handshake()
				c.Write([]byte("x"))
				c.Close()
			}()
		}
	}()
	// accepted dials with a client certificate of ca and reports whether
	// the server took it (with TLS 1.3 a refusal shows at the first read).
	accepted := func(ca *testpki.CA) bool {
		cert := ca.Issue("client").TLS(t)
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(),
			&tls.Config{RootCAs: ca1.Pool(), Certificates: []tls.Certificate{cert}})
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		return err == nil
	}
	raftAccepts := func(ca *testpki.CA) bool {
		block, _ := pem.Decode(ca.Issue("peer").CertPEM)
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: sec.raft.CurrentCAs(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}

	if !accepted(ca1) || accepted(ca2) || !raftAccepts(ca1) || raftAccepts(ca2) {
		t.Fatal("at start: want ca-one's certificates accepted and ca-two's refused")
	}
	r.reload(false) // nothing changed: nothing is re-read
	if n := counter(t, r.ok, "api_client_ca"); n != 0 {
		t.Fatalf("an unchanged bundle was reloaded %v times", n)
	}

	write(ca1.PEM, ca2.PEM)
	r.reload(false)
	if !accepted(ca2) || !accepted(ca1) || !raftAccepts(ca2) {
		t.Fatal("after adding ca-two to the bundle its certificates are still refused")
	}
	for _, what := range []string{"api_client_ca", "raft_ca"} {
		if n := counter(t, r.ok, what); n != 1 {
			t.Fatalf("reloads of %s: %v, want 1", what, n)
		}
	}

	write([]byte("not a PEM bundle"))
	r.reload(false)
	if !accepted(ca2) || !raftAccepts(ca2) {
		t.Fatal("a broken bundle replaced the one in force")
	}
	for _, what := range []string{"api_client_ca", "raft_ca"} {
		if n := counter(t, r.fail, what); n != 1 {
			t.Fatalf("reload errors of %s: %v, want 1", what, n)
		}
	}
	r.reload(false) // still broken, unchanged: not counted again
	if n := counter(t, r.fail, "raft_ca"); n != 1 {
		t.Fatalf("an unchanged broken bundle was counted again: %v", n)
	}
	r.reload(true) // SIGHUP: re-read even unchanged
	if n := counter(t, r.fail, "raft_ca"); n != 2 {
		t.Fatalf("a forced reload of a broken bundle: %v errors, want 2", n)
	}

	// Expiry: testpki's leaves live an hour, its CAs longer.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "leasehold_certificate_expiry_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	for _, c := range []string{"api", "raft", "api_client_ca", "raft_ca"} {
		v, ok := got[c]
		if !ok || v <= 0 {
			t.Fatalf("expiry of %s: %v (present %v); all: %v", c, v, ok, got)
		}
	}
	if got["api"] > 3600 || got["api"] < 3000 {
		t.Fatalf("expiry of the API certificate: %v s, want about an hour", got["api"])
	}
}

// counter is the value of c's series of label.
func counter(t *testing.T, c *prometheus.CounterVec, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
