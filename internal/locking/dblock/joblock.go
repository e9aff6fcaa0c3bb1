package dblock

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// JobLease is a single-run job lock, as ShedLock has it: taken without
// waiting for at most a while (a crashed runner frees the job then, with
// no heartbeat to keep it), and given back no earlier than at least a
// while after it was taken (so that a fast job on an instance whose clock
// runs ahead does not run again in the same period on another). Both are
// judged on the database's clock.
type JobLease struct {
	l      *Locker
	name   string
	owner  string
	ctx    context.Context
	cancel context.CancelFunc
	done   atomic.Bool
}

// TryLock takes the job lock name for at most atMost, without waiting: ok
// false when another holds it. The lease's context ends when atMost has
// passed on this instance's clock, counted from before the database
// started it: the job must stop by then, for another may start.
func (l *Locker) TryLock(ctx context.Context, name string, atMost time.Duration) (*JobLease, bool, error) {
	if atMost <= 0 {
		return nil, false, fmt.Errorf("dblock: job lock %s: at most for %v", name, atMost)
	}
	if l.isClosed() {
		return nil, false, locking.ErrClosed
	}
	owner := l.newOwner()
	sent := time.Now()
	_, ok, err := l.table.acquire(ctx, name, owner, atMost)
	if err != nil {
		l.abandon(name, owner, sent.Add(atMost))
		return nil, false, l.nodeError(fmt.Errorf("job lock %s: %w", name, err))
	}
	if !ok {
		return nil, false, nil
	}
	jctx, cancel := context.WithDeadlineCause(context.WithoutCancel(ctx), sent.Add(atMost-atMost/100),
		fmt.Errorf("%w: job lock %s held for its longest, %v", locking.ErrLockLost, name, atMost))
	return &JobLease{l: l, name: name, owner: owner, ctx: jctx, cancel: cancel}, true, nil
}

// Context ends when the lock's "at most" has run out.
func (j *JobLease) Context() context.Context { return j.ctx }

// Unlock gives the job lock back, but keeps it taken until atLeast after
// it was taken. A lock whose "at most" ran out fails with ErrLockLost; a
// second Unlock with ErrNotHeld.
func (j *JobLease) Unlock(ctx context.Context, atLeast time.Duration) error {
	if !j.done.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	j.cancel()
	ok, err := j.l.table.release(ctx, j.name, j.owner, max(atLeast, 0))
	if err != nil {
		return j.l.nodeError(fmt.Errorf("job lock %s: %w", j.name, err))
	}
	if !ok {
		return fmt.Errorf("%w: job lock %s ran out before its release", locking.ErrLockLost, j.name)
	}
	return nil
}
