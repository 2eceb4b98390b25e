package cluster

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkInmemApply commits one small entry per operation on a
// three-server cluster over the in-memory transport (the path node's tests
// and the chaos suite's in-process tier run on): serial, one entry at a
// time (each its own AppendEntries to each follower and answer), and from
// 64 goroutines (Raft batches them).
func BenchmarkInmemApply(b *testing.B) {
	var cs []*Cluster
	var servers []Server
	for _, id := range []string{"n0", "n1", "n2"} {
		c, err := Open(Config{NodeID: id, InMemory: true, HeartbeatTimeout: time.Second,
			ElectionTimeout: time.Second, LeaderLeaseTimeout: time.Second}, &countFSM{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		cs = append(cs, c)
		servers = append(servers, Server{ID: id, Address: c.Addr, Voter: true})
	}
	for _, c := range cs {
		for _, o := range cs {
			if c != o {
				c.Transport().(raft.WithPeers).Connect(raft.ServerAddress(o.Addr), o.Transport())
			}
		}
		if err := c.BootstrapWith(servers); err != nil {
			b.Fatal(err)
		}
	}
	var leader *Cluster
	deadline := time.Now().Add(30 * time.Second)
	for leader == nil {
		for _, c := range cs {
			if c.IsLeader() {
				leader = c
			}
		}
		if time.Now().After(deadline) {
			b.Fatal("no leader within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	data := make([]byte, 200)
	apply := func(b *testing.B) {
		if err := leader.Apply(data, 10*time.Second).Error(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := cpuTime()
		for range b.N {
			apply(b)
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(32) // 64 goroutines on 2 cores
		cpu0 := cpuTime()
		var failed atomic.Pointer[error] // the first error (b.Fatal is for the benchmark's own goroutine)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := leader.Apply(data, 10*time.Second).Error(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
		if err := failed.Load(); err != nil {
			b.Fatal(*err)
		}
		b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	})
}
