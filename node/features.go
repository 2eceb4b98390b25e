package node

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/cluster"
	"github.com/leasehold/leasehold/fsm"
)

// Features that change what the leader writes (entry checksums, chunked
// expiry, restores through the log) are used once every server of the
// configuration reads them. Gossip says which servers do, but only of the
// servers it knows now: after a restart while one server is down it knows
// nothing of that one. So once gossip has shown every server announcing a
// feature, the leader records it in the replicated state (fsm.Features),
// for good: a server that restarts, or a new leader, reads it there, and a
// server down or not yet known to gossip no longer switches the feature
// off. A server of a release before a recorded feature cannot join or
// rejoin: the leader does not add it (admitPeer).

// featureFlags are the recorded features, their names in messages, and
// the gossip flag that says a server reads each.
var featureFlags = []struct {
	bit  fsm.Features
	name string
	has  func(cluster.Peer) bool
}{
	{fsm.FeatureEntryCRC, "entry checksums", func(p cluster.Peer) bool { return p.EntryCRC }},
	{fsm.FeatureChunkedExpiry, "chunked expiry", func(p cluster.Peer) bool { return p.ChunkedExpiry }},
	{fsm.FeatureRestoreLog, "restores through the log", func(p cluster.Peer) bool { return p.RestoreLog }},
	{fsm.FeatureRestoreBounds, "bounded restores", func(p cluster.Peer) bool { return p.RestoreBounds }},
	{fsm.FeatureChunkedPrune, "chunked pruning", func(p cluster.Peer) bool { return p.ChunkedPrune }},
}

// admitPeer says why new server p may not join (nil: it may): it does not
// announce the gossip flag of a feature the state records (recorded), so
// it would stop at the first entry of that feature it cannot decode.
// cluster.Reconcile neither records nor adds a server it refuses.
func admitPeer(recorded func(fsm.Features) bool, p cluster.Peer) error {
	for _, f := range featureFlags {
		if recorded(f.bit) && !f.has(p) {
			version := p.Version
			if version == "" {
				version = "unknown"
			}
			return fmt.Errorf("server %s does not read %s, which this cluster records: it runs an older release "+
				"(version %s) and would stop at the first entry it cannot read; upgrade it, and it joins", p.ID, f.name, version)
		}
	}
	return nil
}

// recorded reports whether the state this server applied records feature
// (never, with the test's older peer).
func (n *Node) recorded(feature fsm.Features) bool {
	return !n.cfg.olderPeer && fsm.Features(n.rep.features.Load()).Has(feature)
}

// featureOK reports whether every server of the configuration (ids) reads
// feature: recorded, or announced in gossip by every server but this one.
func (n *Node) featureOK(feature fsm.Features, ids []string) bool {
	if n.recorded(feature) {
		return true
	}
	if n.cfg.olderPeer {
		return false
	}
	for _, f := range featureFlags {
		if f.bit == feature {
			return n.mem.EveryServer(ids, f.has)
		}
	}
	return false
}

// recordFeatures, on the leader, records the features every server of the
// configuration (ids) announces that the state does not record yet, once
// every server reads the record itself.
func (n *Node) recordFeatures(ctx context.Context, ids []string) {
	if n.cfg.olderPeer || !n.mem.EveryServer(ids, func(p cluster.Peer) bool { return p.Features }) {
		return
	}
	have := fsm.Features(n.rep.features.Load())
	var want fsm.Features
	for _, f := range featureFlags {
		if !have.Has(f.bit) && n.mem.EveryServer(ids, f.has) {
			want |= f.bit
		}
	}
	if want == 0 {
		return
	}
	res, _, err := n.propose(ctx, &fsm.FeaturesCmd{Features: want})
	if err == nil && res.Err != nil {
		err = res.Err
	}
	if err != nil {
		n.log.Warn("recording the cluster's features failed; the next reconcile pass retries", "features", uint64(want), "err", err)
		return
	}
	n.log.Info("recorded the cluster's features: every server reads them", "features", uint64(want))
}
