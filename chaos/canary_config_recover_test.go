//go:build canary_config_recover

package chaos

func init() {
	activeCanary = "canary_config_recover"
	canaryRecoverAlone = true
}
