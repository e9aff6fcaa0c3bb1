package zklock

import "github.com/go-zookeeper/zk"

// SetWatchHook makes the waiter that talks to ZooKeeper call f each time it
// has set its watch on pred (before it waits). Set it before use.
func (l *Locker) SetWatchHook(f func(node, pred string)) { l.onWatch = f }

// SetCreateHook passes every create's result through f (which may pretend
// the answer was lost). Set it before use.
func (l *Locker) SetCreateHook(f func(path string, err error) (string, error)) { l.onCreate = f }

// SetTokenHook makes every would-be holder call f once it has taken its
// token (with the fence floor it read before), before its lease begins.
// Set it before use.
func (l *Locker) SetTokenHook(f func(name string, token int64)) { l.onToken = f }

// WatchesFired counts the predecessor watches that woke this Locker.
func (l *Locker) WatchesFired() int64 { return l.watches.Load() }

// Conn is the Locker's client, for tests that look at the nodes.
func (l *Locker) Conn() *zk.Conn { return l.conn }

// Dir is the folder of the lock named name.
func (l *Locker) Dir(name string) string { return l.dir(name) }

// LocalWaiters counts the goroutines of this process queued behind the
// one that talks to ZooKeeper for name.
func (l *Locker) LocalWaiters(name string) int { return l.queue.Waiting(name) }

// Node is the lock node the lease's hold stands on.
func (le *Lease) Node() string { return le.h.n.path }

// NamesKept counts the lock names the Locker keeps state for, in use or
// idle.
func (l *Locker) NamesKept() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.names)
}
