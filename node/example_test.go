package node_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/leasehold/leasehold/node"
	"github.com/leasehold/leasehold/wire"
)

// Embedding a node: a single-node cluster in the process, its state in a
// directory, the same operations as the HTTP API without HTTP.
func Example() {
	dir, err := os.MkdirTemp("", "leasehold-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	cfg := node.DefaultConfig()
	cfg.DataDir = dir
	cfg.RaftAddr, cfg.GossipAddr = "127.0.0.1:0", "127.0.0.1:0"
	n, err := node.Open(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer n.Close()
	<-n.Ready()
	if err := n.ReadyErr(); err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	l, _, err := n.Acquire(ctx, wire.AcquireRequest{Key: "tuner/3", Holder: "app", TTLMS: 10_000})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(l.Key, l.Holder, l.State)

	_, _, err = n.Acquire(ctx, wire.AcquireRequest{Key: "tuner/3", Holder: "other", TTLMS: 10_000})
	fmt.Println("other:", wire.ErrorCode(err))

	v, err := n.Validate(ctx, wire.ValidateRequest{Key: "tuner/3", FencingToken: l.FencingToken})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("fencing token valid:", v.Valid)

	if _, err := n.Release(ctx, wire.ReleaseRequest{LeaseID: l.LeaseID, Token: l.Token}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// tuner/3 app active
	// other: LEASE_HELD
	// fencing token valid: true
}
