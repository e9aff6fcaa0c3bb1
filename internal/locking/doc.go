// Package locking is the family of distributed locks the lock strategies
// stand on, and the toolkit every backend shares.
//
// One package per backend sits beside it: redislock (one Redis server, and
// Redlock over several), etcdlock (etcd v3), zklock (ZooKeeper), dblock (a
// lock table in the database), getsetlock (the unsafe GETSET control) and
// semaphore (admission to a SKU). handoff is the local hand-over they
// share, locktest the conformance suite each passes against its real
// server, inventorylock the adapter to the inventory domain.
//
// Every backend says the same things the same way, written once here:
//
//   - errors (errors.go): ErrNotObtained, ErrLockLost, ErrNotHeld,
//     ErrClosed, a server's failure as a NodeError; a wait that ended is
//     NotObtained (wait.go), bounded by WaitContext;
//   - fencing tokens (token.go): base + epoch<<PlaceBits + place, handed
//     out by a Batch; the arithmetic of AdvanceFence (EpochAbove,
//     BaseAbove);
//   - re-entrancy through the lease's context (reentry.go: WithHold,
//     HoldOf);
//   - retries (retry.go): Retry over a backend's own classification of
//     transient failures; the waits between tries are internal/backoff's,
//     which the domain's strategies share.
//
// A backend's lease has a fencing token that grows with every new holder,
// a context that ends with ErrLockLost when the lock is lost, and a
// Release that deletes only its own lock.
package locking
