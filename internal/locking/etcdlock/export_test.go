package etcdlock

import (
	"context"
	"fmt"
)

// ReplayRelease sends le's release to etcd again, as a client retrying a
// release whose first answer it never saw would, long after it landed.
func ReplayRelease(ctx context.Context, le *Lease) (deleted bool, err error) {
	return le.l.deleteOwn(ctx, le.h)
}

// QueueDir is the etcd prefix under which name's waiters queue.
func (l *Locker) QueueDir(name string) string { return l.queueDir(name) }

// OnParked makes l call f each time one of its waiters has its watch on
// its predecessor's key in place, with that key still there: from then on
// only the key's deletion, seen through the watch, moves the waiter. Set it
// before the first Acquire.
func (l *Locker) OnParked(f func(predecessor string)) { l.parked = f }

// OnToken makes every would-be holder of l call f once it has taken its
// token (with the fence floor it read before), before its lease begins.
// Set it before the first Acquire.
func (l *Locker) OnToken(f func(name string, token int64)) { l.onToken = f }

// NamesKept counts the lock names the Locker keeps state for.
func (l *Locker) NamesKept() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}

// GrantBusy reports whether some goroutine holds the Locker's grant slot
// (it is inside session(), granting a lease).
func GrantBusy(l *Locker) bool { return len(l.grant) == 1 }

// FailRenewal does to the current session exactly what keepAlive's
// lose does when KeepAliveOnce returns an error that etcd's client does not
// retry (any gRPC code other than Unavailable/Internal) while the lease
// itself still lives in etcd. It returns the lost lease's id.
func FailRenewal(l *Locker, cause error) (int64, bool) {
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	if s == nil {
		return 0, false
	}
	l.loseSession(s, fmt.Errorf("renewal failed: %w", cause))
	return int64(s.id), true
}

// KeyContextEnded reports whether the context of le's key has ended: once
// the key is given back it must, or it stays a child of the session's
// context until the session ends.
func KeyContextEnded(le *Lease) bool { return le.h.keyCtx.Err() != nil }
