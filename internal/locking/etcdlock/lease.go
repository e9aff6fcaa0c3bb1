package etcdlock

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/flashsale/stock/internal/locking"
)

// Lease is one holder's claim on a lock. Release it when done.
type Lease struct {
	l        *Locker
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	stopLoss func() bool
	released atomic.Bool
}

// Token is the fencing token: it grows strictly with every new holder of
// the name, across processes (see the package documentation).
func (le *Lease) Token() int64 { return le.h.token }

// Context derives from the one given to Acquire; it ends with a cause
// wrapping locking.ErrLockLost when the lock is lost, and when the lease is
// released. Pass it to Acquire to take the same name again (reentrancy).
func (le *Lease) Context() context.Context { return le.ctx }

// hold is one possession of a lock by this process, shared by the
// reentrant leases of one holder and passed from holder to holder inside
// the process.
type hold struct {
	name      string
	key       string // this process's key in the name's queue
	createRev int64
	sess      *session
	token     int64 // this holder's token: a place of batch
	budget    int   // local hand-overs left before the lock goes back to etcd
	// batch is the tokens of the batch this holder's token belongs to (the
	// package documentation): a hand-over gives the next holder its next
	// place, without a request to etcd, while it lasts and can be trusted.
	batch locking.Batch
	// keyCtx ends when the key is known gone (its session ended, or
	// someone else deleted it: Reset) with a cause wrapping
	// locking.ErrLockLost; stopWatch ends the watch on it once the key's
	// holders are done with it. Both go with the key from holder to
	// holder inside the process.
	keyCtx    context.Context
	keyCancel context.CancelCauseFunc
	stopWatch context.CancelFunc

	mu    sync.Mutex
	count int // leases not yet released
}

// handOn returns the hold to pass to the next holder in the process: the
// same key, a hold of its own, so that a context left over from this
// holder's leases can never re-enter the next holder's.
func (h *hold) handOn() *hold {
	return &hold{name: h.name, key: h.key, createRev: h.createRev, sess: h.sess, budget: h.budget,
		token: h.token, batch: h.batch,
		keyCtx: h.keyCtx, keyCancel: h.keyCancel, stopWatch: h.stopWatch}
}

// newLease is a lease on h under ctx, marked with h for reentrancy
// (locking.WithHold): it ends when h's key is lost.
func (l *Locker) newLease(ctx context.Context, h *hold) *Lease {
	lctx, cancel := context.WithCancelCause(locking.WithHold(ctx, l, h.name, h))
	stop := context.AfterFunc(h.keyCtx, func() { cancel(context.Cause(h.keyCtx)) })
	return &Lease{l: l, h: h, ctx: lctx, cancel: cancel, stopLoss: stop}
}

// reenter gives a holder that takes its name again under one of its
// leases' contexts (locking.HoldOf) one more lease on its hold, unless the
// hold is already given back or its key lost.
func (l *Locker) reenter(ctx context.Context, h *hold) *Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.count == 0 || h.keyCtx.Err() != nil {
		return nil
	}
	h.count++
	return l.newLease(ctx, h)
}
