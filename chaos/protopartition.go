package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/api/client"
)

// protoPartitioner is a Cluster that can cut some protocols only between
// servers (NetnsCluster).
type protoPartitioner interface {
	PartitionProtocols(groups [][]int, p Protocols) error
}

// protoPartition cuts node n off from the others for the protocols p only
// for d. While it is in force, seen (if not nil) is polled every 200 ms: the first time
// it reports true, the counter effect goes up (the scenario's proof that
// the cut did what it should: a protocol cut that changes nothing fails
// the run's effectiveness check).
func (e *Env) protoPartition(ctx context.Context, n int, p Protocols, d time.Duration, effect string, seen func(ctx context.Context) bool) error {
	pp, ok := e.C.(protoPartitioner)
	if !ok {
		return fmt.Errorf("chaos: the %s tier cannot cut one protocol only: %w", e.Tier, ErrUnsupported)
	}
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	return e.Fault(ctx, "partition-"+p.String(), fmt.Sprintf("node %d alone on %s", n, p), d, func() error {
		if err := pp.PartitionProtocols([][]int{{n}, e.Others(n)}, p); err != nil {
			return err
		}
		if seen == nil {
			return nil
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-wctx.Done():
					return
				case <-t.C:
				}
				cctx, cancel := context.WithTimeout(wctx, 2*time.Second)
				ok := seen(cctx)
				cancel()
				if ok && wctx.Err() == nil {
					e.Count(effect, 1)
					e.Note(effect, fmt.Sprintf("node %d alone on %s", n, p), nil)
					return
				}
			}
		}()
		return nil
	}, func() error {
		stop()
		return e.C.Heal()
	})
}

// gossipSeesFailed reports whether node i's cluster view lists a peer that
// gossip finds failed.
func (e *Env) gossipSeesFailed(i int) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		st, err := e.Admin(i).Cluster(ctx)
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.ID != e.C.NodeID(i) && m.Gossip == "failed" {
				return true
			}
		}
		return false
	}
}

// forwardFails reports whether a linearizable read sent to node i, which
// it must forward to the leader, fails.
func forwardFails(c Cluster, i int) func(ctx context.Context) bool {
	cl, err := client.New([]string{c.HTTPAddr(i)}, client.Options{Timeout: 2 * time.Second})
	return func(ctx context.Context) bool {
		if err != nil {
			return false
		}
		_, err := cl.Cluster(ctx)
		return err != nil
	}
}
