package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/testpki"
	"github.com/leasehold/leasehold/node"
)

// serveTLS serves h over TLS with conf on a loopback port and returns the
// address.
func serveTLS(t *testing.T, h http.Handler, conf *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: log.New(io.Discard, "", 0)} // refused handshakes are expected
	go srv.Serve(tls.NewListener(ln, conf))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func staticCert(c tls.Certificate) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &c, nil }
}

func clientCert(c *tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if c == nil {
			return &tls.Certificate{}, nil
		}
		return c, nil
	}
}

func httpsClient(roots *x509.CertPool, cert *tls.Certificate) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ClientTLS(roots, clientCert(cert))}}
}

func getStatus(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// The API over TLS: a client trusting the CA gets answers over TLS 1.2+;
// one that does not, or that offers TLS 1.1, fails the handshake.
func TestHTTPSServes(t *testing.T) {
	ca := testpki.NewCA(t, "api-ca")
	addr := serveTLS(t, New(newFake(), Options{}), ServerTLS(staticCert(ca.Issue("server").TLS(t)), nil, false))
	code, body, err := getStatus(httpsClient(ca.Pool(), nil), "https://"+addr+"/v1/leases/ls_9")
	if err != nil || code != 200 || !strings.Contains(body, `"lease_id"`) {
		t.Fatalf("GET over TLS: %d %q %v", code, body, err)
	}
	// HTTP/1.1 even for a client that would take HTTP/2.
	h2 := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ClientTLS(ca.Pool(), nil), ForceAttemptHTTP2: true}}
	resp, err := h2.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 1 {
		t.Fatalf("negotiated %s", resp.Proto)
	}
	other := testpki.NewCA(t, "other")
	if _, _, err := getStatus(httpsClient(other.Pool(), nil), "https://"+addr+"/healthz"); err == nil {
		t.Fatal("a client not trusting the server's CA got an answer")
	}
	old := ClientTLS(ca.Pool(), nil)
	old.MinVersion, old.MaxVersion, old.CipherSuites = tls.VersionTLS11, tls.VersionTLS11, nil
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: old}}
	if _, _, err := getStatus(c, "https://"+addr+"/healthz"); err == nil {
		t.Fatal("TLS 1.1 was accepted")
	}
	// Plain HTTP to the TLS port gets Go's 400 "client sent an HTTP
	// request to an HTTPS server", never an API answer.
	code, body, err = getStatus(&http.Client{Timeout: 10 * time.Second}, "http://"+addr+"/v1/leases/ls_9")
	if err == nil && (code != http.StatusBadRequest || strings.Contains(body, "lease_id")) {
		t.Fatalf("plain HTTP to the TLS port: %d %q", code, body)
	}
}

// Client certificates: required means no certificate and a certificate from
// another CA are refused at the handshake; verify-if-given lets a client
// without one in but still refuses a bad one.
func TestHTTPSClientCertificates(t *testing.T) {
	serverCA, clientCA, other := testpki.NewCA(t, "server-ca"), testpki.NewCA(t, "client-ca"), testpki.NewCA(t, "other")
	good := clientCA.Issue("worker-1").TLS(t)
	bad := other.Issue("intruder").TLS(t)
	serverCert := serverCA.Issue("server").TLS(t)
	fake := newFake()
	required := serveTLS(t, New(fake, Options{}), ServerTLS(staticCert(serverCert), clientCA.Pool(), true))
	optional := serveTLS(t, New(fake, Options{}), ServerTLS(staticCert(serverCert), clientCA.Pool(), false))

	for _, tc := range []struct {
		name   string
		addr   string
		cert   *tls.Certificate
		wantOK bool
	}{
		{"required, good certificate", required, &good, true},
		{"required, no certificate", required, nil, false},
		{"required, other CA", required, &bad, false},
		{"optional, good certificate", optional, &good, true},
		{"optional, no certificate", optional, nil, true},
		{"optional, other CA", optional, &bad, false},
	} {
		before := len(fake.called())
		code, body, err := getStatus(httpsClient(serverCA.Pool(), tc.cert), "https://"+tc.addr+"/v1/leases/ls_9")
		ok := err == nil && code == 200
		if ok != tc.wantOK {
			t.Fatalf("%s: status %d %q err %v; want ok=%v", tc.name, code, body, err, tc.wantOK)
		}
		if !tc.wantOK && len(fake.called()) != before {
			t.Fatalf("%s: the refused request reached the node", tc.name)
		}
	}
}

// A follower serving TLS forwards to the leader over TLS with ForwardTLS:
// the leader requires a client certificate and the follower presents its
// own. A leader whose certificate the follower does not trust is never
// sent the request: NO_LEADER, not INDETERMINATE.
func TestForwardOverTLS(t *testing.T) {
	ca := testpki.NewCA(t, "cluster-ca")
	leaderCert, followerCert := ca.Issue("leader").TLS(t), ca.Issue("follower").TLS(t)
	leaderNode := newFake()
	var seenTLS, seenForwarded string
	leaderAPI := New(leaderNode, Options{})
	leaderAddr := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			seenTLS = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		seenForwarded = r.Header.Get(headerForwarded)
		leaderAPI.ServeHTTP(w, r)
	}), ServerTLS(staticCert(leaderCert), ca.Pool(), true))

	local := newFake()
	f := &followerFake{fakeNode: local, leader: node.LeaderInfo{ID: "l1", HTTPAddr: leaderAddr}, known: true}
	follower := New(f, Options{ForwardTLS: ClientTLS(ca.Pool(), clientCert(&followerCert))})
	followerAddr := serveTLS(t, follower, ServerTLS(staticCert(followerCert), ca.Pool(), true))

	c := httpsClient(ca.Pool(), &followerCert)
	resp, err := c.Post("https://"+followerAddr+"/v1/leases", "application/json", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(b), `"lease-secret"`) {
		t.Fatalf("forwarded acquire over TLS: %d %s", resp.StatusCode, b)
	}
	leaderNode.only(t, "Acquire")
	if len(local.called()) != 0 || seenForwarded != "f1" || seenTLS != "follower" {
		t.Fatalf("local calls %v, forwarded-by %q, leader saw client certificate %q", local.called(), seenForwarded, seenTLS)
	}

	// The follower does not trust the leader's CA: the write is refused
	// before it is sent, so NO_LEADER.
	stranger := testpki.NewCA(t, "stranger")
	impostor := serveTLS(t, New(newFake(), Options{}), ServerTLS(staticCert(stranger.Issue("impostor").TLS(t)), nil, false))
	f2 := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l2", HTTPAddr: impostor}, known: true}
	addr2 := serveTLS(t, New(f2, Options{ForwardTLS: ClientTLS(ca.Pool(), clientCert(&followerCert))}),
		ServerTLS(staticCert(followerCert), nil, false))
	resp, err = c.Post("https://"+addr2+"/v1/leases", "application/json", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "NO_LEADER") {
		t.Fatalf("forward to an untrusted leader: %d %s", resp.StatusCode, b)
	}

	// The leader refuses the follower's client certificate (another CA):
	// never applied. TLS 1.3 tells the client after its handshake, so the
	// refusal shows either as the leader's alert (NO_LEADER) or as a write
	// to a closed connection (INDETERMINATE, the cautious answer).
	f3 := &followerFake{fakeNode: newFake(), leader: node.LeaderInfo{ID: "l1", HTTPAddr: leaderAddr}, known: true}
	wrongClient := stranger.Issue("follower-x").TLS(t)
	addr3 := serveTLS(t, New(f3, Options{ForwardTLS: ClientTLS(ca.Pool(), clientCert(&wrongClient))}),
		ServerTLS(staticCert(followerCert), nil, false))
	before := len(leaderNode.called())
	resp, err = c.Post("https://"+addr3+"/v1/leases", "application/json", strings.NewReader(`{"key":"k","holder":"h","ttl_ms":5000}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	refused := resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "NO_LEADER") ||
		resp.StatusCode == http.StatusGatewayTimeout && strings.Contains(string(b), "INDETERMINATE")
	if !refused || len(leaderNode.called()) != before {
		t.Fatalf("forward with a refused client certificate: %d %s (leader calls %d -> %d)", resp.StatusCode, b, before, len(leaderNode.called()))
	}
}

func TestTLSRefusedClassification(t *testing.T) {
	if !tlsRefused(&tls.CertificateVerificationError{Err: errors.New("x")}) ||
		!tlsRefused(&net.OpError{Op: "remote error", Err: errors.New("tls: bad certificate")}) {
		t.Fatal("handshake refusals not recognized")
	}
	if tlsRefused(&net.OpError{Op: "remote error", Err: errors.New("tls: bad record MAC")}) || tlsRefused(io.ErrUnexpectedEOF) {
		t.Fatal("a mid-stream failure counted as a refusal")
	}
}
