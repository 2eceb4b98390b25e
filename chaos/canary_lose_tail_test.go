//go:build canary_lose_tail

package chaos

func init() { activeCanary = "canary_lose_tail" }
