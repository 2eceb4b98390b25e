package chaos

// canaryRecoverAlone, set by the canary_config_recover build of the tests
// (a deliberate harness fault, not a product bug), makes
// churn-remove-partition rewrite a follower's configuration instead of
// removing it: the follower is stopped, `leasehold data recover` makes it
// the one voter of its cluster while the others still run, and it is
// started again. The configuration checker must catch it (a voter set
// changed by more than one voter, to a configuration no leader appended).
var canaryRecoverAlone bool
