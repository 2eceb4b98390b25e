//go:build canary_lose_tail

package node

import "github.com/hashicorp/raft"

// canaryLoseTail (build tag canary_lose_tail) is a deliberate bug for the
// chaos suite to catch: a server forgets the last canaryTailEntries entries of
// its Raft log when it starts again (as a store that acknowledged writes it
// had not made durable), and its graceful stop takes no snapshot that would
// cover them. Never set in a normal build.
const canaryLoseTail = true

// canaryTailEntries is how many of the log's last entries a restart loses.
const canaryTailEntries = 200

// canaryDropTail deletes the last canaryTailEntries entries of logs (never
// the first two: the bootstrap configuration stays).
func canaryDropTail(logs raft.LogStore) {
	first, err1 := logs.FirstIndex()
	last, err2 := logs.LastIndex()
	if err1 != nil || err2 != nil || last < first+2 {
		return
	}
	from := max(first+2, last-min(last, canaryTailEntries)+1)
	_ = logs.DeleteRange(from, last)
}
