// Package fsm is Leasehold's replicated lease state machine.
//
// The state machine is pure and deterministic: its only inputs are the
// current state, the Raft log index of an entry and the decoded command in
// it. It reads no clock, draws no randomness, performs no I/O and starts no
// goroutines. Everything random (lease ids, secret tokens) or timed (TTLs in
// ticks, display wall times) is decided by the proposer and carried in the
// command. Two replicas that apply the same entries therefore hold the same
// state and produce byte-identical snapshots.
//
// Time is the tick: the Raft leader appends Tick commands from its monotonic
// clock and every TTL, expiry, lock-delay, wait and retention is counted in
// committed ticks. See DESIGN.md for the reasoning behind the expiry bound.
//
// A refused command is a business failure returned as an *Error value in
// the apply result, never a panic. The error codes and the Error type are
// package wire's (named here by aliases): the state machine knows codes,
// not how a transport renders them; wire, its only non-standard import,
// links no HTTP and no network.
//
// An FSM is not safe for concurrent use; the caller serialises Apply and
// guards reads (package node does both).
package fsm
