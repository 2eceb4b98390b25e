//go:build canary_wall_apply

package chaos

func init() { activeCanary = "canary_wall_apply" }
