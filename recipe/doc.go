// Package recipe holds the higher-level coordination recipes built on
// leases, in the manner of etcd's clientv3/concurrency and consul/api's
// Lock and Semaphore: Session, Mutex, Semaphore and Election.
//
// Every recipe runs over a Backend, one small interface that the remote
// client (*client.Client, package api/client) implements as it is and that
// package recipe/embedded provides for a node embedded in the process.
//
// A Session is one server session kept alive by one keep-alive
// (client.KeepAlive, the same deadline rule as every keep-alive of this
// module): the leases of all the mutexes, semaphores and elections made on
// it are bound to it, so one heartbeat keeps them all. Its Done channel
// closes before the server could end the session, counted from the send
// time of the last successful heartbeat, and so before any of its leases
// could be granted to someone else: from then on the holder must stop
// touching what they guard. A lease revoked by an operator ends at once,
// without such warning: each Mutex, Semaphore and Election has its own
// loss signal, Lost (and LostErr), closed when its lease ends on the server
// (learnt from one event stream per session, filtered by its holder,
// moments after the end), when the session is lost, or on Unlock, Release
// or Resign.
//
// Each recipe exposes its lease's fencing token: pass it with every access
// to the guarded resource and check it there (client.FenceGuard).
package recipe
