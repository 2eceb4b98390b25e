package cluster

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
)

// mappedKiB is the resident size of this process's mappings of path
// (/proc/self/smaps).
func mappedKiB(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	defer f.Close()
	total, in := 0, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && fields[5] == path
			continue
		}
		var kb int
		if in && strings.HasPrefix(line, "Rss:") {
			if _, err := fmt.Sscanf(line, "Rss: %d kB", &kb); err == nil {
				total += kb
			}
		}
	}
	return total
}

// TestBoltStoreReleasesMappedPages: the pages of raft.db that reading the
// log mapped are dropped when a compaction deletes entries, and again
// after releaseMappedEvery bytes of entries read, and the entries read back
// the same afterwards.
func TestBoltStoreReleasesMappedPages(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	b, _, err := openBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const n = 2000
	data := make([]byte, 8<<10)
	var logs []*raft.Log
	for i := uint64(1); i <= n; i++ {
		data[0], data[len(data)-1] = byte(i), byte(i>>8)
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: append([]byte(nil), data...)})
		if len(logs) == 100 {
			if err := b.StoreLogs(logs); err != nil {
				t.Fatal(err)
			}
			logs = logs[:0]
		}
	}
	readAll := func(from uint64) {
		t.Helper()
		var l raft.Log
		for i := from; i <= n; i++ {
			if err := b.GetLog(i, &l); err != nil {
				t.Fatal(err)
			}
			if l.Index != i || l.Data[0] != byte(i) || l.Data[len(l.Data)-1] != byte(i>>8) {
				t.Fatalf("entry %d reads back as index %d, data %d..%d", i, l.Index, l.Data[0], l.Data[len(l.Data)-1])
			}
		}
	}
	// Reading 16 MiB maps them, below releaseMappedEvery.
	b.mapped.Store(0)
	readAll(1)
	if kb := mappedKiB(t, path); kb < 8<<10 {
		t.Fatalf("%d KiB of raft.db mapped after reading 16 MiB of entries: the test measures nothing", kb)
	}
	if err := b.DeleteRange(1, n/2); err != nil {
		t.Fatal(err)
	}
	if kb := mappedKiB(t, path); kb > 64 {
		t.Fatalf("%d KiB of raft.db still mapped after a compaction", kb)
	}
	// Past releaseMappedEvery bytes, reading alone releases them.
	for range releaseMappedEvery/(n/2*len(data)) + 1 {
		readAll(n/2 + 1)
	}
	if got := b.mapped.Load(); got >= releaseMappedEvery {
		t.Fatalf("%d bytes read since the last release, past %d", got, releaseMappedEvery)
	}
	readAll(n/2 + 1)
}
