package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http/httptest"
	"time"

	"github.com/leasehold/leasehold/api"
	"github.com/leasehold/leasehold/api/client"
	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// exampleServer runs a single in-memory node with the HTTP API on a
// loopback port and returns its address; stop closes both.
func exampleServer() (addr string, stop func()) {
	cfg := node.DefaultConfig()
	cfg.InMemory, cfg.DataDir, cfg.RaftAddr = true, "", ""
	cfg.GossipAddr = "127.0.0.1:0"
	n, err := node.Open(cfg)
	if err != nil {
		log.Fatal(err)
	}
	<-n.Ready()
	srv := httptest.NewServer(api.New(api.FromNode(n), api.Options{}))
	return srv.URL, func() { srv.Close(); n.Close() }
}

func ExampleClient() {
	addr, stop := exampleServer()
	defer stop()
	// List every node of the cluster: requests fail over between them.
	c, err := client.New([]string{addr}, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	l, err := c.Acquire(ctx, wire.AcquireRequest{Key: "camera/7", Holder: "recorder-1", TTLMS: 10_000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Key, l.Holder, l.State)

	_, err = c.Acquire(ctx, wire.AcquireRequest{Key: "camera/7", Holder: "recorder-2", TTLMS: 10_000})
	fmt.Println("second holder:", client.ErrorCode(err))

	if _, err := c.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
		log.Fatal(err)
	}
	got, err := c.Get(ctx, l.LeaseID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after release:", got.State)
	// Output:
	// camera/7 recorder-1 active
	// second holder: LEASE_HELD
	// after release: released
}

func ExampleClient_AcquireKeepAlive() {
	addr, stop := exampleServer()
	defer stop()
	c, err := client.New([]string{addr}, client.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	ka, err := c.AcquireKeepAlive(ctx, wire.AcquireRequest{Key: "job/nightly", Holder: "runner", TTLMS: 5_000}, client.KeepAliveOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// Do the work under ka.Context(): it is cancelled when the lease is
	// lost, before the server could give it to anyone else.
	select {
	case <-ka.Context().Done():
		fmt.Println("lost:", ka.Err())
	case <-time.After(10 * time.Millisecond):
		fmt.Println("working under", ka.Key())
	}
	if err := ka.Release(ctx, "done"); err != nil {
		log.Fatal(err)
	}
	fmt.Println(errors.Is(ka.Err(), client.ErrKeepAliveStopped))
	// Output:
	// working under job/nightly
	// true
}

func ExampleFenceGuard() {
	// The resource side: remember the highest fencing token per key and
	// refuse lower ones (a holder that lost its lease without noticing).
	var g client.FenceGuard
	fmt.Println(g.Check("camera/7", 12)) // the holder's write
	fmt.Println(g.Check("camera/7", 15)) // a newer holder's write
	err := g.Check("camera/7", 12)       // the old holder, paused meanwhile
	fmt.Println(errors.Is(err, client.ErrStaleToken))
	// Output:
	// <nil>
	// <nil>
	// true
}
