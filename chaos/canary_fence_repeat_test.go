//go:build canary_fence_repeat

package chaos

func init() { activeCanary = "canary_fence_repeat" }
