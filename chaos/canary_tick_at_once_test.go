//go:build canary_tick_at_once

package chaos

func init() { activeCanary = "canary_tick_at_once" }
