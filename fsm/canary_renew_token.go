//go:build !canary_renew_token

package fsm

// canaryRenewToken (build tag canary_renew_token) is a deliberate bug for the
// chaos suite to catch: a renewal does not check the lease token. Never set
// in a normal build.
const canaryRenewToken = false
