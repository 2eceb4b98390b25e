package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/wire"
)

// How the bench's per-request workloads (cycle, half-load, contended,
// renew, session, fill) reach the server (--via).
const (
	// viaRaw is the load generator's own HTTP/1.1 connection per worker
	// (benchConn): the server's cost, with as little client as possible.
	viaRaw = "raw"
	// viaClient is api/client, one Client shared by every worker, as a Go
	// program uses it: what a user pays, to set beside etcd's clientv3.
	viaClient = "client"
)

// parseVia reads --via: raw, client, or both ("raw,client"), in order.
func parseVia(s string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(s, ",") {
		switch v = strings.TrimSpace(v); v {
		case viaRaw, viaClient:
			for _, o := range out {
				if o == v {
					return nil, fmt.Errorf("--via names %q twice", v)
				}
			}
			out = append(out, v)
		default:
			return nil, fmt.Errorf("--via: %q is neither %q nor %q", v, viaRaw, viaClient)
		}
	}
	return out, nil
}

// benchOps is one worker's way to the server for the per-request
// workloads: benchConn (raw) or clientOps (api/client).
type benchOps interface {
	acquire(key, holder string, ttlMS, waitMS int64) (id, token string, err error)
	release(id, token string) error
	renew(id, token string) error
	sessionHeartbeat(id, token string) error
	close()
}

// clientOps does a worker's operations through api/client. The client is
// shared; the context is the workload's.
type clientOps struct {
	ctx   context.Context
	c     *client.Client
	grant bool
}

func (o *clientOps) acquire(key, holder string, ttlMS, waitMS int64) (string, string, error) {
	l, err := o.c.Acquire(o.ctx, wire.AcquireRequest{Key: key, Holder: holder, TTLMS: ttlMS, WaitMS: waitMS, Grant: o.grant})
	if err != nil {
		return "", "", err
	}
	if l.LeaseID == "" || l.Token == "" {
		return "", "", fmt.Errorf("bench: acquire answer without lease id or token")
	}
	return l.LeaseID, l.Token, nil
}

func (o *clientOps) release(id, token string) error {
	_, err := o.c.Release(o.ctx, wire.ReleaseRequest{LeaseID: id, Token: token})
	return err
}

func (o *clientOps) renew(id, token string) error {
	_, err := o.c.RenewWith(o.ctx, wire.RenewRequest{LeaseID: id, Token: token, Grant: o.grant})
	return err
}

func (o *clientOps) sessionHeartbeat(id, token string) error {
	_, err := o.c.SessionHeartbeat(o.ctx, id, token)
	return err
}

func (o *clientOps) close() {}

// viaMatters reports whether --via changes how workload reaches the server:
// keepalive and heartbeat use the Go client either way.
func viaMatters(workload string) bool { return workload != "keepalive" && workload != "heartbeat" }

// viaLabel names a workload run through via in the bench's output.
func viaLabel(workload, via string) string {
	if via == viaClient {
		return workload + " (client)"
	}
	return workload
}
