package fsm

// The sealing key's check value. The node derives the idempotency hash and
// the key that seals an idempotent acquire's token from a per-cluster
// sealing key kept outside the data directory (node/seal.go); the state
// records only a short check value of that key, so that a server started
// with another key refuses to serve instead of silently failing to match
// idempotent retries. The latest SealCheck applied wins (a key rotation
// records the new one). Snapshots carry it; it may be absent.

// MaxSealCheckBytes bounds a check value.
const MaxSealCheckBytes = 32

// SealCheck records the check value of the cluster's sealing key.
type SealCheck struct {
	// Check is 1-32 bytes derived from the key (never the key).
	Check []byte `json:"check"`
}

// TypeSealCheck is the type of a SealCheck entry.
const TypeSealCheck Type = 15

func (*SealCheck) Type() Type { return TypeSealCheck }

// sealCheckCmd applies a SealCheck: a valid one replaces the recorded value;
// an empty or oversized one is refused (INVALID_ARGUMENT) and changes nothing.
func (r *registry) sealCheckCmd(c *SealCheck) Result {
	if len(c.Check) == 0 || len(c.Check) > MaxSealCheckBytes {
		return Result{Err: InvalidField("check", "seal check must be 1-%d bytes, got %d", MaxSealCheckBytes, len(c.Check))}
	}
	r.sealCheck = string(c.Check)
	return Result{}
}

// SealCheck returns the recorded check value of the sealing key; nil until
// a SealCheck command applied.
func (r *registry) SealCheck() []byte {
	if r.sealCheck == "" {
		return nil
	}
	return []byte(r.sealCheck)
}

func (c *SealCheck) fields(f fields) { f.bytes(&c.Check) }
