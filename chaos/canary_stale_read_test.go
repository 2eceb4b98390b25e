//go:build canary_stale_read

package chaos

func init() { activeCanary = "canary_stale_read" }
