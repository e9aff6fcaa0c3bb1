package zklock

import (
	"context"
	"sync/atomic"

	"github.com/flashsale/stock/internal/locking"
)

// A holder's side: the node as it passes from holder to holder in this
// process, the hold its re-entrant leases share, and the Lease.

// node is a hold on the lock as it passes from holder to holder in this
// process.
type node struct {
	name       string
	path       string // the ephemeral node, full path
	version    int32  // its data version: never written, so 0
	budget     int    // local hand-overs left
	alone      bool   // no other node was queued when the process got the lock
	generation int    // nameState.generation when the process got the lock

	// The places of the batch that the last token write began, for
	// hand-overs without a write of their own (see takeToken): usable
	// while the connection's epoch is still epoch, the write's. The batch
	// itself checks the rest: a place above the name's fence floor, less
	// than a third of the session timeout after the write was sent.
	batch locking.Batch
	epoch uint64
}

// hold is one holder's possession of the lock, shared by its reentrant
// leases.
type hold struct {
	l      *Locker
	n      *node
	token  int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	count  int   // leases not yet released; guarded by l.mu
	lost   error // why the lock was lost; guarded by l.mu
}

// hold makes n's lock this goroutine's: a token (the next place of n's
// batch, or a token write that begins a new one), then a lease.
//
// The lease begins under l.mu, the lock AdvanceFence raises the fence
// floor under, and only with a token above the floor as it is then: the
// floor read before the token was taken may be out of date by the time it
// is (an AdvanceFence that returned in between: the place was chosen
// above the old floor, the write's base read before the new one). A
// token at or below it is not used: the next is taken above it.
func (l *Locker) hold(ctx, wctx context.Context, n *node) (*Lease, error) {
	for {
		l.mu.Lock()
		epoch, floor := l.epoch, l.nameLocked(n.name).floor
		l.mu.Unlock()
		token, err := l.takeToken(wctx, n, epoch, floor)
		if err != nil {
			return nil, err
		}
		if l.onToken != nil {
			l.onToken(n.name, token)
		}
		h := &hold{l: l, n: n, token: token, count: 1}
		h.ctx, h.cancel = context.WithCancelCause(locking.WithHold(ctx, l, n.name, h))
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			h.cancel(locking.ErrClosed)
			return nil, locking.ErrClosed
		}
		if l.epoch != epoch {
			// The connection dropped around the write: it may have been
			// the session's last. Check again (the node tells).
			l.mu.Unlock()
			h.cancel(context.Canceled)
			if wctx.Err() != nil {
				return nil, wctx.Err()
			}
			continue
		}
		if token <= l.nameLocked(n.name).floor {
			// An AdvanceFence returned after the floor was read: take the
			// batch's first place above its floor, or write again. The
			// floor is raised only once the fence base is (AdvanceFence),
			// so a write from now on lands above it: this ends.
			l.mu.Unlock()
			h.cancel(context.Canceled)
			continue
		}
		l.holds[h] = struct{}{}
		l.mu.Unlock()
		lctx, cancel := context.WithCancelCause(h.ctx)
		return &Lease{h: h, ctx: lctx, cancel: cancel}, nil
	}
}

// loseLocked ends h's leases with cause (the first cause stays h's); l.mu
// is held.
func (h *hold) loseLocked(cause error) {
	if h.lost == nil {
		h.lost = cause
	}
	h.cancel(cause)
}

// reenter is Acquire under a context that carries h (locking.HoldOf):
// another lease of h, unless h was released or lost (nil: then Acquire
// waits for the lock as any other).
func (l *Locker) reenter(ctx context.Context, h *hold) *Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h.count == 0 || h.lost != nil {
		return nil
	}
	h.count++
	lctx, cancel := context.WithCancelCause(ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}
}

// Lease is one holder's claim on a lock.
type Lease struct {
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	released atomic.Bool
}

// Token returns the fencing token: it grows strictly with every new holder
// of the name, in every process (see the package documentation). Pass it
// to the resource the lock protects, which should refuse tokens not above
// the highest it has seen.
func (le *Lease) Token() int64 { return le.h.token }

// Context returns a context derived from Acquire's. It ends with a cause
// wrapping locking.ErrLockLost when the lock may be lost (the connection
// was suspended, the session expired, the Locker closed) and with
// context.Canceled when the lease is released. Do the protected work under
// it, and pass it to Acquire to take the same name again (reentrancy).
func (le *Lease) Context() context.Context { return le.ctx }

// Release gives the lease up. The last lease of a hold passes the lock to
// the next local waiter or deletes its node (only its own, by version;
// under context.WithoutCancel(ctx), waiting at most half a session
// timeout). It
// returns locking.ErrNotHeld for a second Release, and an error wrapping
// locking.ErrLockLost if the lock had been lost: the work under it was not
// protected to the end.
func (le *Lease) Release(ctx context.Context) error {
	if !le.released.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	le.cancel(context.Canceled)
	h := le.h
	l := h.l
	l.mu.Lock()
	h.count--
	last, lost := h.count == 0, h.lost
	if last {
		delete(l.holds, h)
	}
	l.mu.Unlock()
	if !last {
		return lost
	}
	h.cancel(context.Canceled)
	err := l.passOn(ctx, h.n, lost != nil)
	l.done(h.n.name) // Acquire's use
	if lost != nil {
		return lost
	}
	return err
}
