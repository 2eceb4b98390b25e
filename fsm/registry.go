package fsm

// registry owns the cluster's own records, which share nothing with
// leases: the member registry (member.go) and its grant keys
// (grantkey.go), the cluster id (clusterid.go), the seal check
// (sealcheck.go) and the recorded features (features.go). It reads the
// core only for the index and tick it stamps records with.
type registry struct {
	*core
	members   map[string]MemberRecord
	clusterID string   // "" until set
	sealCheck string   // the sealing key's check value; "" until set
	features  Features // the cluster's recorded features
}
