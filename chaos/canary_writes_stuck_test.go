//go:build canary_writes_stuck

package chaos

func init() { activeCanary = "canary_writes_stuck" }
