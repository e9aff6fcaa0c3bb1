package etcdlock

import (
	"fmt"
)

// ReviewGrantBusy reports whether some goroutine holds the Locker's grant
// mutex (it is inside session(), granting a lease). Test-only: it probes
// with TryLock and lets go at once.
func ReviewGrantBusy(l *Locker) bool { return len(l.grant) == 1 }

// ReviewFailRenewal does to the current session exactly what keepAlive's
// lose does when KeepAliveOnce returns an error that etcd's client does not
// retry (any gRPC code other than Unavailable/Internal) while the lease
// itself still lives in etcd. It returns the lost lease's id.
func ReviewFailRenewal(l *Locker, cause error) (int64, bool) {
	l.mu.Lock()
	s := l.sess
	l.mu.Unlock()
	if s == nil {
		return 0, false
	}
	l.loseSession(s, fmt.Errorf("renewal failed: %w", cause))
	return int64(s.id), true
}
