//go:build canary_no_guard

package chaos

func init() { activeCanary = "canary_no_guard" }
