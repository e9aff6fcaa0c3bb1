package inventory

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/internal/locking"
)

// Names of the lock strategies.
const (
	NameRedisLock = "redis-lock"
	NameRedlock   = "redlock"
)

// Locker is what the lock strategies need: *locking.Locker (one Redis) and
// *locking.Redlock (a majority of several) both have it.
type Locker interface {
	Acquire(ctx context.Context, key string) (*locking.Lease, error)
	Reset(ctx context.Context, key string) error
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
}

// Locked deducts under a distributed lock on the SKU with the plain
// read-check-write that is unsafe without it — so the lock is what protects
// it. With fencing on, the write also requires the row's fence to be lower
// than the lease's token and stores the token: a holder whose lock expired
// while it was paused is refused, however late it wakes.
type Locked struct {
	name    string
	locker  Locker
	fencing bool
	obs     Observer
	ping    func(context.Context) error
	freeze  func()
	frozen  atomic.Bool
	lookup  func(ctx context.Context, sku string) error
}

// LockedOption configures Locked.
type LockedOption func(*Locked)

// WithFencing turns the fencing-token check of the write on or off. Default
// on; off exists only to demonstrate what fencing prevents.
func WithFencing(on bool) LockedOption {
	return func(l *Locked) { l.fencing = on }
}

// WithLockObserver sets who hears about lock waits, holds and fenced-off
// writes. Default: NopObserver.
func WithLockObserver(o Observer) LockedOption {
	return func(l *Locked) { l.obs = o }
}

// WithPing sets the readiness check of the lock's backend. Default: none.
func WithPing(ping func(context.Context) error) LockedOption {
	return func(l *Locked) { l.ping = ping }
}

// WithFreezeAfterRead makes the first order this strategy takes call freeze
// between its read and its write, while it holds the lock, and then write
// without heeding the loss of its lock — as a process frozen (SIGSTOP, a
// stalled VM, a long GC pause) with its write already on the way would.
// freeze is expected to stop the whole process, watchdog included, so that
// the lock can expire and another holder take it. It exists to demonstrate
// fencing. Default nil: never.
func WithFreezeAfterRead(freeze func()) LockedOption {
	return func(l *Locked) { l.freeze = freeze }
}

// WithSKULookup makes an order check that its SKU exists before it takes the
// lock, so that requests for unknown SKUs leave no lock keys or fencing
// counters behind in Redis. lookup returns an error wrapping ErrUnknownSKU
// for an unknown SKU. Default: none (every order takes the lock).
func WithSKULookup(lookup func(ctx context.Context, sku string) error) LockedOption {
	return func(l *Locked) { l.lookup = lookup }
}

// NewLocked returns a lock strategy named name (NameRedisLock or
// NameRedlock) over locker.
func NewLocked(name string, locker Locker, opts ...LockedOption) *Locked {
	l := &Locked{name: name, locker: locker, fencing: true, obs: NopObserver{}}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Name implements Strategy.
func (l *Locked) Name() string { return l.name }

func lockKey(sku string) string { return "sku:" + sku }

// Deduct implements Strategy.
func (l *Locked) Deduct(ctx context.Context, sku string, quantity int64, inTx TxRunner) error {
	if l.lookup != nil {
		if err := l.lookup(ctx, sku); err != nil {
			return err
		}
	}
	began := time.Now()
	lease, err := l.locker.Acquire(ctx, lockKey(sku))
	if err != nil {
		return lockError(err)
	}
	acquired := time.Now()
	l.obs.LockAcquired(l.name, acquired.Sub(began))
	defer func() {
		// Release must happen even when the order's deadline has passed,
		// or the next buyer waits out the TTL.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		relErr := lease.Release(rctx)
		lost := errors.Is(relErr, locking.ErrLockLost) || errors.Is(context.Cause(lease.Context()), locking.ErrLockLost)
		l.obs.LockReleased(l.name, time.Since(acquired), lost)
	}()

	// The lease's context ends when the watchdog finds the lock lost, which
	// aborts the transaction; fencing covers the holder that does not learn
	// it in time.
	txCtx := lease.Context()
	freeze := l.freeze != nil && l.frozen.CompareAndSwap(false, true)
	if freeze {
		// The frozen holder's write is already on its way: the loss of
		// the lock cannot stop it any more, only the fence can.
		var cancel context.CancelFunc
		txCtx, cancel = context.WithTimeout(context.WithoutCancel(txCtx), 30*time.Second)
		defer cancel()
	}
	var rowFence int64
	err = inTx(txCtx, func(ctx context.Context, tx Tx) error {
		level, err := readAvailable(ctx, tx, sku, quantity)
		rowFence = level.Fence
		if err != nil {
			return err
		}
		if freeze {
			l.freeze()
		}
		if !l.fencing {
			return tx.Deduct(ctx, sku, quantity)
		}
		ok, err := tx.DeductIfFenced(ctx, sku, quantity, lease.Token())
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: token %d on %q", ErrFencedOff, lease.Token(), sku)
		}
		return nil
	})
	if errors.Is(err, ErrFencedOff) {
		// Either a newer holder wrote (the counter is past the row's fence
		// already, and this changes nothing), or Redis lost its counter and
		// began again below the fence: then every holder would be refused
		// until the counter caught up. Push it past what the row has seen.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if aerr := l.locker.AdvanceFence(actx, lockKey(sku), rowFence); aerr != nil {
			err = errors.Join(err, fmt.Errorf("advance the fence of %q: %w", sku, aerr))
		}
	}
	return err
}

// lockError files a failed acquisition: Redis servers that failed are a
// backend outage, a lock held by others past the wait is contention (also
// when the wait's deadline cut a call to a server short). Either way the
// order fails closed.
func lockError(err error) error {
	if serverFailed(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrBusy, err)
}

// serverFailed reports whether err holds a NodeError for another reason
// than the caller's deadline or cancellation.
func serverFailed(err error) bool {
	switch e := err.(type) {
	case *locking.NodeError:
		return !errors.Is(e.Err, context.DeadlineExceeded) && !errors.Is(e.Err, context.Canceled)
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if serverFailed(inner) {
				return true
			}
		}
	case interface{ Unwrap() error }:
		return serverFailed(e.Unwrap())
	}
	return false
}

// ResetSKU clears the SKU's lock and fence counter, for a new sale.
func (l *Locked) ResetSKU(ctx context.Context, sku string) error {
	return l.locker.Reset(ctx, lockKey(sku))
}

// Ping checks the lock's backend.
func (l *Locked) Ping(ctx context.Context) error {
	if l.ping == nil {
		return nil
	}
	if err := l.ping(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return nil
}
