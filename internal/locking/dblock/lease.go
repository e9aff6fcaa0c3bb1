package dblock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/locking"
	"github.com/flashsale/stock/internal/locking/handoff"
)

// hold is one holder's ownership of a lock row, shared by the leases of a
// reentrant owner.
type hold struct {
	name   string
	owner  string
	token  int64
	budget int // local hand-overs left before the lock goes back to the table

	ctx    context.Context
	lose   context.CancelCauseFunc
	stop   context.CancelFunc // ends the heartbeat, and its renewal in flight
	beaten chan struct{}      // closed when the heartbeat has ended

	mu       sync.Mutex
	refs     int       // live leases; 0: released
	deadline time.Time // when the database may give the lock away, at the earliest
}

// Lease is one holding of a lock.
type Lease struct {
	l        *Locker
	h        *hold
	mu       sync.Mutex
	released bool
}

// Token is the lock's fencing token: greater for every new holder.
func (le *Lease) Token() int64 { return le.h.token }

// Context ends when the lock is lost (cause ErrLockLost) or released. An
// Acquire of the same name under it re-enters the lock.
func (le *Lease) Context() context.Context { return le.h.ctx }

// leaseFrom is how long the holder counts on a lease set by a statement
// sent at sent: the database counts its TTL from when it ran it, later, so
// the holder's deadline comes first. The 1% is the clocks' rate drift.
func (l *Locker) leaseFrom(sent time.Time) time.Time {
	return sent.Add(l.cfg.ttl - l.cfg.ttl/100)
}

// start makes h a held lock of ctx's caller: its context (keeping ctx's
// values, not its end: a wait's bound must not end the lease it gave) and
// its heartbeat.
func (l *Locker) start(ctx context.Context, h *hold) *Lease {
	hctx, lose := context.WithCancelCause(context.WithoutCancel(ctx))
	h.ctx = locking.WithHold(hctx, l, h.name, h)
	h.lose = lose
	h.refs = 1
	beat, stop := context.WithCancel(l.closeCtx)
	h.stop = stop
	h.beaten = make(chan struct{})
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.holds[h] = struct{}{}
		l.wg.Go(func() { l.heartbeat(beat, h) })
	}
	l.mu.Unlock()
	switch {
	case closed:
		close(h.beaten)
		h.loseTo(fmt.Errorf("%w: %w", locking.ErrLockLost, locking.ErrClosed))
	case h.expired():
		// A hand-over that waited past its lease: the heartbeat would
		// end it, but not before the caller ran.
		h.loseTo(fmt.Errorf("%w: %s reached its holder after its lease", locking.ErrLockLost, h.name))
	}
	return &Lease{l: l, h: h}
}

// expired reports whether h's deadline has passed. It reads the deadline
// under h.mu: the heartbeat, already started, renews it (read bare here,
// it was a data race with the first renewal).
func (h *hold) expired() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !time.Now().Before(h.deadline)
}

// loseTo ends h's context with cause, once.
func (h *hold) loseTo(cause error) { h.lose(cause) }

// heartbeat renews h every renewal interval until beat ends (h released,
// which also cuts a renewal in flight, or the Locker closed). A renewal the
// table refuses (the lock was taken over or reset) loses h at once; one
// that fails is retried until h's deadline, and then h is lost.
func (l *Locker) heartbeat(beat context.Context, h *hold) {
	defer close(h.beaten)
	every := l.cfg.renewInterval()
	next := time.NewTimer(every)
	defer next.Stop()
	for {
		h.mu.Lock()
		deadline := h.deadline
		h.mu.Unlock()
		expiry := time.NewTimer(time.Until(deadline))
		select {
		case <-beat.Done():
			expiry.Stop()
			if l.closeCtx.Err() != nil {
				h.loseTo(fmt.Errorf("%w: %w", locking.ErrLockLost, locking.ErrClosed))
			}
			return
		case <-expiry.C:
			h.loseTo(fmt.Errorf("%w: %s not renewed within its TTL %v", locking.ErrLockLost, h.name, l.cfg.ttl))
			return
		case <-next.C:
			expiry.Stop()
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(beat, deadline)
		ok, err := l.table.renew(ctx, h.name, h.owner, l.cfg.ttl)
		cancel()
		switch {
		case beat.Err() != nil:
			continue // released or closed: the select above ends it
		case err == nil && ok:
			l.cfg.renewed(nil)
			h.mu.Lock()
			h.deadline = l.leaseFrom(sent)
			h.mu.Unlock()
			next.Reset(every)
		case err == nil:
			l.cfg.renewed(fmt.Errorf("%s is no longer %s's", h.name, h.owner))
			h.loseTo(fmt.Errorf("%w: %s was taken over or reset", locking.ErrLockLost, h.name))
			return
		default:
			l.cfg.renewed(err)
			// Retry soon; the expiry timer above ends it in time.
			next.Reset(min(every, l.cfg.pollMax*5))
		}
	}
}

// Release gives the lease up. The last lease of a hold releases the lock:
// to the next goroutine of this process waiting for it (with a new token),
// or in the table. A lock lost before fails with ErrLockLost; a second
// Release with ErrNotHeld.
func (le *Lease) Release(ctx context.Context) error {
	le.mu.Lock()
	if le.released {
		le.mu.Unlock()
		return locking.ErrNotHeld
	}
	le.released = true
	le.mu.Unlock()
	return le.l.release(ctx, le.h)
}

func (l *Locker) release(ctx context.Context, h *hold) error {
	h.mu.Lock()
	h.refs--
	last := h.refs == 0
	h.mu.Unlock()
	if !last {
		return lost(h) // the outer lease releases the lock
	}
	h.stop()
	<-h.beaten
	l.mu.Lock()
	delete(l.holds, h)
	l.mu.Unlock()
	cause := lost(h)
	h.loseTo(locking.ErrNotHeld)
	if cause == nil && h.budget > 0 && l.queue.Waiting(h.name) > 0 {
		err := l.handOver(ctx, h)
		if err == nil {
			return nil // the turn went on, or was ended, with the lock
		}
		if errors.Is(err, locking.ErrLockLost) {
			cause = err
		}
	}
	err := l.free(ctx, h, 0)
	l.queue.Done(h.name)
	if cause != nil {
		// The lock had been lost; the row was freed anyway if it was
		// still ours (a heartbeat that could not reach the database).
		return cause
	}
	return err
}

// lost returns why h was lost, or nil.
func lost(h *hold) error {
	if cause := context.Cause(h.ctx); errors.Is(cause, locking.ErrLockLost) {
		return cause
	}
	return nil
}

// handOver passes h to the next goroutine of this process that waits for
// it, with the next token, in one statement. nil: the next goroutine has
// the lock, or, if it left meanwhile, the lock was freed and the turn
// ended. An error leaves the turn to the caller.
func (l *Locker) handOver(ctx context.Context, h *hold) error {
	next := l.newOwner()
	sent := time.Now()
	token, ok, err := l.table.handOver(ctx, h.name, h.owner, next, l.cfg.ttl)
	if err != nil {
		l.abandon(h.name, next, sent.Add(l.cfg.ttl))
		return l.nodeError(fmt.Errorf("hand %s over: %w", h.name, err))
	}
	if !ok {
		return fmt.Errorf("%w: %s was no longer %s's at its hand-over", locking.ErrLockLost, h.name, h.owner)
	}
	passed := &hold{name: h.name, owner: next, token: token, budget: h.budget - 1, deadline: l.leaseFrom(sent)}
	if !l.queue.Pass(h.name, passed) {
		// The waiter left as the lock came (found by review: the turn
		// was never ended, and the process could not take the name again).
		_ = l.free(ctx, passed, 0)
		l.queue.Done(h.name)
	}
	return nil
}

// endTurn ends a turn that reached a waiter as it gave up: a handed hold
// goes to the next waiter, or back to the table, on a goroutine of the
// Locker's, so that the waiter returns at its deadline even when the
// database does not answer.
func (l *Locker) endTurn(name string, t handoff.Turn[*hold]) {
	if !t.Handed {
		l.queue.Done(name)
		return
	}
	h := t.Hold
	pass := func() {
		ctx, cancel := context.WithTimeout(l.closeCtx, l.cfg.ttl)
		defer cancel()
		if h.budget > 0 && l.queue.Waiting(name) > 0 && l.handOver(ctx, h) == nil {
			return
		}
		_ = l.free(ctx, h, 0)
		l.queue.Done(name)
	}
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.wg.Go(pass)
	}
	l.mu.Unlock()
	if closed {
		// Close does not know this hold: its lease runs out by itself.
		l.queue.Done(name)
	}
}

// free releases h's row in the table (keep: see table.release).
func (l *Locker) free(ctx context.Context, h *hold, keep time.Duration) error {
	ok, err := l.table.release(ctx, h.name, h.owner, keep)
	if err != nil {
		// The lease runs out by itself within the TTL.
		return l.nodeError(fmt.Errorf("release %s: %w", h.name, err))
	}
	if ok && keep == 0 && l.queue.Waiting(h.name) > 0 {
		l.mu.Lock()
		l.released.mark(h.name, time.Now())
		l.mu.Unlock()
	}
	if !ok {
		return fmt.Errorf("%w: %s was no longer %s's at its release", locking.ErrLockLost, h.name, h.owner)
	}
	return nil
}
