//go:build canary_renew_token

package chaos

func init() { activeCanary = "canary_renew_token" }
