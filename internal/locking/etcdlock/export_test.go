package etcdlock

import "context"

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

// NamesKept counts the lock names the Locker keeps state for.
func (l *Locker) NamesKept() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}
