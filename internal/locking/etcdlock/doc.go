// Package etcdlock is a lock on etcd v3 with a fencing token, for
// STRATEGY=etcd-lock.
//
// # The recipe
//
// One session per process: an etcd lease that the Locker keeps alive. To
// take a name, a process creates a key of its own under the name's queue
// prefix, attached to the session's lease; etcd gives every key a create
// revision from one global counter, so the keys queue in creation order.
// The key with the lowest create revision holds the lock; every other
// waits for the deletion of the key just before its own (its predecessor
// only: a release wakes one waiter, not the herd). A release deletes the
// key; a crashed process's keys go when its lease expires, one TTL after
// its last renewal.
//
// Inside one process, goroutines queue locally first (internal/locking/
// handoff): only one of them at a time has a key in etcd, and a release
// passes the lock to the next local waiter without a trip through etcd's
// queue, as long as the hold's budget lasts: the number of local waiters
// there were when the lock was taken from etcd. Then the lock goes back to
// the end of etcd's queue, behind the other processes.
//
// # The fencing token
//
// A token is locking's two-part token (internal/locking/token.go) with
// etcd's revision as the epoch: base + R<<16 + i. R is the etcd revision
// at which it was established that a batch's first holder holds (the read
// that found no predecessor, or the write that took the key back for a new
// batch), base is the value of the name's fence key read at that same
// revision (AdvanceFence raises it; it only grows), and i is the holder's
// place in its batch: 0 for the first, and each local hand-over gives the
// next holder the next place without a request to etcd.
//
// Tokens grow strictly in hold order. Inside a batch, i grows. The next
// batch's R' is above every revision of the batch before it: a holder of
// another process reads its queue position after the batch's key was
// deleted, and a new batch in this process writes its key again, each a
// revision above everything the batch before did, so R'<<16 is above
// R<<16 + i for every place i < 1<<16 (a batch that would pass 65,536
// holders begins a new one). Taking the create revision instead would
// break fencing with local hand-overs: process P holds with create
// revision 10, process Q queues at 11, P hands over locally; if P's second
// holder kept 10 it could not be told from P's first, and if it took a
// later write's revision (say 12) Q would hold next with 11, below it.
//
// A place is handed on only while the key is still this process's (its
// watch has not seen it go, its session lives) and within a third of the
// TTL of the request that established the batch's revision, as a renewal
// would be; past that the next holder writes the key again (which fails
// if it is gone) and begins a new batch. AdvanceFence(atLeast) makes every
// later batch's tokens greater than atLeast, and this process hands on no
// place at or below it (another process may hand on a place of a batch it
// began before: the store refuses it, and that process advances the fence
// in turn). Once AdvanceFence has returned, no lease of this process begins
// with a token at or below atLeast, however its token was taken: a holder
// compares it with the floor as its lease begins, under the lock the floor
// is raised under, and takes another if it must.
//
// # Known problems of etcd's own recipe (concurrency.Mutex) this avoids
//
//   - Its cleanup Unlock runs without a deadline: killing a three-member
//     cluster's leader stalled waiters 5–8 s past their contexts. Every
//     cleanup here runs under WithOpTimeout; a key whose deletion failed is
//     deleted later by a goroutine the Locker owns.
//   - A waiter does not notice that its own session expired and waits
//     forever behind a key that is gone. Here a wait ends when the session
//     is lost, and the waiter queues again on a new session.
//   - A retried stale Unlock can delete a newer lock of the same session
//     (its key is the session's lease id). Here every acquisition has a key
//     of its own, and a deletion applies only if the key still has the
//     create revision its holder saw.
//   - Its waiters watch from a revision already past, which etcd serves
//     from its catching-up loop every 100 ms: a contended hand-over costs
//     about 100 ms. Here a waiter's watch starts at the revision current
//     when it is registered, which etcd serves as the deletion happens, and
//     a read once it is in place catches a deletion that came before.
//
// # Loss
//
// A lease's context ends, with a cause wrapping locking.ErrLockLost, when
// the session's lease can no longer be trusted: a renewal failed, or its
// validity (the time before the renewal was sent plus the TTL etcd
// granted, less 1% for clock drift) ran out before a renewal came back.
// The protected write must still carry the token: a holder can pause past
// its lease's end without running any code.
package etcdlock
