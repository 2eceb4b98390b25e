package api

import (
	"crypto/tls"
	"crypto/x509"
)

// TLSCipherSuites are the TLS 1.2 suites the API offers: ECDHE key
// exchange with AEAD ciphers only (TLS 1.3 suites are not configurable and
// all fine).
var TLSCipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// ServerTLS is the TLS configuration of the HTTP API: TLS 1.2 or later,
// TLSCipherSuites, the certificate from getCert (called on every
// handshake, so it may return a reloaded one). With clientCAs set, client
// certificates are verified against them: required if requireClientCert,
// otherwise checked only when a client presents one.
func ServerTLS(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *x509.CertPool, requireClientCert bool) *tls.Config {
	c := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   TLSCipherSuites,
		GetCertificate: getCert,
		// HTTP/1.1 only: streams, WebSocket upgrades and connection
		// hijacking behave as over plain HTTP.
		NextProtos: []string{"http/1.1"},
	}
	if clientCAs != nil {
		c.ClientCAs = clientCAs
		c.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClientCert {
			c.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return c
}

// ClientTLS is the client side matching ServerTLS: TLS 1.2 or later,
// servers verified against roots (nil: the system roots), and getCert, if
// set, answering a server that asks for a client certificate.
func ClientTLS(roots *x509.CertPool, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		CipherSuites:         TLSCipherSuites,
		RootCAs:              roots,
		GetClientCertificate: getCert,
	}
}
