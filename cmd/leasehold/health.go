package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// healthCmd probes one node for a container health check or a script:
// GET /readyz (or /healthz with --live). Exit status 0 when the node
// answers 200, 1 otherwise (Docker's "unhealthy"), 2 on a bad command line.
func (a *app) healthCmd(ctx context.Context, args []string) error {
	fs := a.newFlagSet("health", "", "Check that one node is ready (GET /readyz; --live: GET /healthz, the process serves HTTP).\n"+
		"Exit status 0 when it is, 1 when not or unreachable: for HEALTHCHECK and scripts.\n"+
		"Without --addr or LEASEHOLD_ADDR it probes the server's own LEASEHOLD_HTTP_ADDR (0.0.0.0\n"+
		"becomes 127.0.0.1), over https without verifying the certificate when LEASEHOLD_TLS_CERT\n"+
		"is set (the probe sends no token).")
	addr := fs.String("addr", "", "node address host:port or URL (env LEASEHOLD_ADDR; default: LEASEHOLD_HTTP_ADDR, else 127.0.0.1:7700)")
	timeout := fs.Duration("timeout", 3*time.Second, "bound on the probe")
	live := fs.Bool("live", false, "probe /healthz (the process serves HTTP) instead of /readyz (the node is ready)")
	quiet := fs.Bool("quiet", false, "print nothing")
	if _, err := a.parse(fs, args, envVars("addr"), 0); err != nil {
		return err
	}
	if *timeout <= 0 {
		return usageErrorf("--timeout must be positive")
	}
	url, insecure := a.healthURL(*addr)
	path := "/readyz"
	if *live {
		path = "/healthz"
	}
	hc := &http.Client{Timeout: *timeout}
	if insecure {
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // a probe of the local process that sends nothing secret
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+path, nil)
	if err != nil {
		return usageErrorf("--addr: %v", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return &exitError{code: exitFailure, msg: "unhealthy: " + err.Error()}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return &exitError{code: exitFailure, msg: fmt.Sprintf("unhealthy: %s %s", resp.Status, strings.TrimSpace(string(body)))}
	}
	if !*quiet {
		fmt.Fprintf(a.stdout, "healthy: %s%s %s\n", url, path, strings.TrimSpace(string(body)))
	}
	return nil
}

// healthURL is the base URL health probes, and whether its certificate goes
// unverified (the server's own address over TLS).
func (a *app) healthURL(addr string) (string, bool) {
	insecure := false
	if addr == "" {
		addr = "127.0.0.1:7700"
		if v, ok := a.lookupEnv("LEASEHOLD_HTTP_ADDR"); ok && v != "" {
			addr = v
			if host, port, err := net.SplitHostPort(v); err == nil {
				if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
					if ip != nil && ip.To4() == nil {
						host = "::1"
					} else {
						host = "127.0.0.1"
					}
				}
				addr = net.JoinHostPort(host, port)
			}
			if v, ok := a.lookupEnv("LEASEHOLD_TLS_CERT"); ok && v != "" {
				return "https://" + addr, true
			}
		}
	}
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/"), insecure
	}
	return "http://" + addr, insecure
}
