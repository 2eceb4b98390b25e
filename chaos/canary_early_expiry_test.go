//go:build canary_early_expiry

package chaos

func init() { activeCanary = "canary_early_expiry" }
