//go:build canary_data_race

package chaos

func init() { activeCanary = "canary_data_race" }
