//go:build canary_fence_reset

package chaos

func init() { activeCanary = "canary_fence_reset" }
