//go:build canary_clock_stops

package chaos

func init() { activeCanary = "canary_clock_stops" }
