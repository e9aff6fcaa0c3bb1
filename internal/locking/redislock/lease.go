package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// hold is one holder's possession of a lock, shared by its reentrant leases.
type hold struct {
	c      *core
	ks     *keyState
	a      *attempt
	count  int   // leases not yet released; guarded by c.mu
	lost   error // why the lock was lost; guarded by c.mu
	ctx    context.Context
	cancel context.CancelCauseFunc
	expiry *time.Timer // fires when validity runs out unrenewed

	// The watchdog is a timer whose function renews the lock and re-arms
	// it, rather than a goroutine per hold that mostly sleeps: a short hold
	// then costs no goroutine start and no wake-ups to stop it.
	wmu      sync.Mutex
	idle     *sync.Cond // signalled when a renewal finishes
	renewal  *time.Timer
	running  bool               // a renewal is in progress
	stopped  bool               // no more renewals
	stopCtx  context.Context    // cancelled to cut an in-flight renewal short
	stopCall context.CancelFunc //
}

// Lease is one holder's claim on a lock. Release it when done; until then
// the watchdog renews the lock and Context is cancelled if it is lost.
type Lease struct {
	h        *hold
	ctx      context.Context
	cancel   context.CancelCauseFunc
	released atomic.Bool
}

// newHold makes a's lock a hold with a lease. It refuses (errExpired, with
// nothing changed) a lock whose validity has ended: a lease must never
// start without a lock behind it.
func (c *core) newHold(ctx context.Context, ks *keyState, a *attempt) (*Lease, error) {
	if !time.Now().Before(a.validUntil) {
		return nil, errExpired
	}
	h := &hold{c: c, ks: ks, a: a, count: 1}
	h.ctx, h.cancel = context.WithCancelCause(locking.WithHold(ctx, c, ks.key, h))
	h.idle = sync.NewCond(&h.wmu)
	h.stopCtx, h.stopCall = context.WithCancel(context.Background())
	// The expiry timer does not depend on renewals running: if they stall,
	// the work is still stopped when validity ends. It is armed only once
	// h.expiry is set: a validity that ends within microseconds would
	// otherwise run lose, which stops h.expiry, before the assignment.
	h.expiry = time.AfterFunc(time.Hour, func() {
		h.lose(fmt.Errorf("%w: %s: validity ended before a renewal succeeded", locking.ErrLockLost, ks.key))
	})
	h.expiry.Reset(time.Until(a.validUntil))

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		h.expiry.Stop()
		h.cancel(locking.ErrClosed)
		_ = c.releaseSlot(ctx, ks, a)
		return nil, errors.Join(locking.ErrNotObtained, locking.ErrClosed)
	}
	ks.hold = h
	c.holds[h] = struct{}{}
	c.mu.Unlock()

	h.wmu.Lock()
	h.renewal = time.AfterFunc(h.nextRenewal(), h.renew)
	h.wmu.Unlock()
	lctx, cancel := context.WithCancelCause(h.ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}, nil
}

func (c *core) reenter(ctx context.Context, h *hold) *Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h.count == 0 || h.lost != nil {
		return nil
	}
	h.count++
	lctx, cancel := context.WithCancelCause(ctx)
	return &Lease{h: h, ctx: lctx, cancel: cancel}
}

// lose cancels the protected work with cause, which wraps locking.ErrLockLost.
func (h *hold) lose(cause error) {
	h.c.mu.Lock()
	if h.lost == nil {
		h.lost = cause
	}
	h.c.mu.Unlock()
	h.expiry.Stop()
	h.cancel(cause)
}

// nextRenewal is the renewal interval, or half the remaining validity if
// that is shorter (a lock received with little validity left).
func (h *hold) nextRenewal() time.Duration {
	d := h.c.cfg.renewInterval()
	if half := time.Until(h.a.validUntil) / 2; half < d {
		d = max(half, 0)
	}
	return d
}

// renew is the watchdog: it renews the lock and re-arms itself. A failed
// renewal stops the work at once: the holder learns it from its context,
// never from a log line.
func (h *hold) renew() {
	h.wmu.Lock()
	if h.stopped {
		h.wmu.Unlock()
		return
	}
	h.running = true
	h.wmu.Unlock()

	ok := h.renewOnce()

	h.wmu.Lock()
	h.running = false
	if ok && !h.stopped {
		h.renewal.Reset(h.nextRenewal())
	}
	h.idle.Broadcast()
	h.wmu.Unlock()
}

func (h *hold) renewOnce() bool {
	c, a, ctx := h.c, h.a, h.stopCtx
	if hook := c.renewHook.Load(); hook != nil {
		if err := (*hook)(ctx, a.key); err != nil {
			if ctx.Err() == nil {
				h.lose(lostCause(a.key, err))
			}
			return false
		}
	}
	if !time.Now().Before(a.validUntil) {
		return false // the expiry timer has cancelled the work
	}
	rctx, cancel := context.WithDeadline(ctx, a.validUntil)
	until, err := c.be.extend(rctx, a)
	cancel()
	if ctx.Err() != nil {
		return false // released meanwhile
	}
	if err != nil {
		// The work stops before the observer hears of the failure: whoever
		// sees the failed renewal may rely on the context being cancelled.
		h.lose(lostCause(a.key, err))
	}
	if c.cfg.onRenew != nil {
		c.cfg.onRenew(a.key, err)
	}
	if err != nil {
		return false
	}
	if !h.expiry.Stop() {
		return false // validity ended while we renewed: already lost
	}
	a.validUntil = until
	h.expiry.Reset(time.Until(until))
	return true
}

// stopRenewal stops the watchdog and waits for a renewal in progress: after
// it returns, nothing touches the lock on the holder's behalf.
func (h *hold) stopRenewal() {
	h.stopCall()
	h.wmu.Lock()
	h.stopped = true
	if h.renewal != nil {
		h.renewal.Stop()
	}
	for h.running {
		h.idle.Wait()
	}
	h.wmu.Unlock()
}

func lostCause(key string, err error) error {
	if errors.Is(err, locking.ErrLockLost) {
		return err
	}
	return fmt.Errorf("%w: %s: renewal failed: %w", locking.ErrLockLost, key, err)
}

// Token returns the fencing token: it grows strictly with every new holder
// of the key (see the package documentation). Pass it to the resource the
// lock protects, which should reject tokens lower than one it has seen.
func (l *Lease) Token() int64 { return l.h.a.fence }

// Context returns a context derived from the one given to Acquire. It is
// cancelled when the lock is lost, with a cause wrapping locking.ErrLockLost
// (context.Cause), and when the lease is released. Do the protected work
// under it, and pass it to Acquire to take the same key again (reentrancy).
func (l *Lease) Context() context.Context { return l.ctx }

// Release gives the lease up. The last lease of a hold stops the watchdog,
// waits for it, and releases the lock in Redis under
// context.WithoutCancel(ctx) with the node timeout, so a cancelled request
// never strands a lock; a waiter is woken at once. It returns locking.ErrNotHeld for
// a second Release, and an error wrapping locking.ErrLockLost when the lock had been
// lost (expired, taken, or no longer confirmed by a majority): the work done
// under it was not protected to the end.
func (l *Lease) Release(ctx context.Context) error {
	if !l.released.CompareAndSwap(false, true) {
		return locking.ErrNotHeld
	}
	l.cancel(context.Canceled)
	h := l.h
	c := h.c
	c.mu.Lock()
	h.count--
	last := h.count == 0
	lost := h.lost
	c.mu.Unlock()
	if !last {
		return lost
	}
	h.stopRenewal()
	h.expiry.Stop()
	c.mu.Lock()
	lost = h.lost
	h.ks.hold = nil
	delete(c.holds, h)
	c.mu.Unlock()
	h.cancel(context.Canceled)
	h.a.lost = lost != nil
	err := c.releaseSlot(ctx, h.ks, h.a)
	if lost != nil {
		return lost
	}
	return err
}
