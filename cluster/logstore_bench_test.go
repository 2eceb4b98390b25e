package cluster

import (
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkLogAppend appends one entry of about a lease command's size per
// operation to each log store, as a follower's append does (each append is
// durable when it returns).
func BenchmarkLogAppend(b *testing.B) {
	for _, name := range []string{LogStoreBoltDB, LogStoreWAL} {
		for _, batch := range []int{1, 16} {
			b.Run(name+"/batch="+strconv.Itoa(batch), func(b *testing.B) {
				kind := name
				dir := b.TempDir()
				bolt, format, err := openBolt(filepath.Join(dir, "raft.db"))
				if err != nil {
					b.Fatal(err)
				}
				defer bolt.Close()
				logs, closer, err := openLogs(dir, bolt, format, kind, 0, slog.New(slog.DiscardHandler))
				if err != nil {
					b.Fatal(err)
				}
				defer closer.Close()
				b.ReportAllocs()
				data := make([]byte, 200)
				next := uint64(1)
				b.ResetTimer()
				cpu0 := cpuTime()
				for range b.N {
					batchLogs := make([]*raft.Log, batch)
					for j := range batchLogs {
						batchLogs[j] = &raft.Log{Index: next, Term: 1, Type: raft.LogCommand, Data: data}
						next++
					}
					if err := logs.StoreLogs(batchLogs); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}
