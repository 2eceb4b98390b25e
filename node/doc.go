// Package node assembles one Leasehold server and is the embedded Go API.
//
// Open a node from a Config (DefaultConfig gives a single-node cluster),
// wait for Ready, call the same operations the HTTP API offers, with the
// same semantics and errors (*Error with a contract code), subscribe to
// events, and Close it. The HTTP API (package api) is a thin layer on top.
//
// Writes are proposed through Raft; concurrent writes are batched into one
// log entry (group commit). Secret tokens and ids are generated here before
// proposing; only hashes of secrets enter the log. Reads are linearizable by
// default: leadership is confirmed and the answer reflects every write
// committed before the read began. Stale reads answer from local state.
//
// The WebSocket control lease (control.go) is an ordinary lease on the
// reserved key ControlKey, granted, refreshed and released only by the
// Control* methods on behalf of a WebSocket connection (package api serves
// the socket); the public lease operations refuse that key and control
// lease ids. ControlCheck is the gate of the routes it protects.
//
// Time: the leader's tick loop paces ticks on the monotonic clock, and
// wall-clock readings only end up in display fields; both go through
// clock.go, which a build with the `chaos` tag replaces with a clock the
// chaos suite shifts and speeds up (clock_chaos.go). Files canary_*.go hold
// deliberate bugs that only their own build tag compiles in.
//
// Configuration (Config): a numeric field left zero means its default;
// where a setting can be turned off or a limit lifted, a negative value
// says so (StateCheckInterval -1: no state check; MaxLeases -1: no limit),
// and elsewhere a negative value is invalid. Zero never means "off" or
// "unlimited" unless that is the default (DeadServerTimeout's). Packages
// cluster and api follow the same rule.
//
// All methods are safe for concurrent use.
package node
