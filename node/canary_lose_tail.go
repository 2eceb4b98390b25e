//go:build !canary_lose_tail

package node

import "github.com/hashicorp/raft"

// canaryLoseTail (build tag canary_lose_tail) is a deliberate bug for the
// chaos suite to catch: a server forgets the last canaryTailEntries entries of
// its Raft log when it starts again (as a store that acknowledged writes it
// had not made durable), and its graceful stop takes no snapshot that would
// cover them. Never set in a normal build.
const canaryLoseTail = false

// canaryDropTail is never called in a normal build.
func canaryDropTail(raft.LogStore) {}
