// Package locked is the lock strategy: read, check and write a SKU's stock
// under a distributed lock (any backend of internal/locking, through
// internal/locking/inventorylock), with a fencing token and the version read
// guarding the write itself.
package locked

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// Lease is one holding of a lock, as the lock strategies need it. Every
// lock backend (internal/locking/...) implements it, through
// internal/locking/inventorylock, which also translates the backends'
// errors into this package's.
type Lease interface {
	// Token is the fencing token: it grows with every new holder of the
	// lock, so the row can refuse a write from an older one.
	Token() int64
	// Context ends when the lock is known to be lost (or released): the
	// work under the lock runs in it.
	Context() context.Context
	// Release gives the lock up, if it is still this lease's. It returns
	// an error wrapping ErrLockLost when the lock had been lost before.
	Release(ctx context.Context) error
}

// ErrLockLost: a lease stopped being its holder's while it was held (it
// expired, a renewal failed, the session ended). The work under it was not
// protected to the end; fencing and the version check keep it from
// overselling.
var ErrLockLost = errors.New("lock lost")

// Locker is what the lock strategies need from a lock backend.
type Locker interface {
	// Acquire waits for key's lock. Its error wraps ErrUnavailable when the
	// lock service failed; any other error means the lock stayed busy (or
	// the wait ended) and is answered ErrBusy.
	Acquire(ctx context.Context, key string) (Lease, error)
	// Reset clears a key's lock state for a new sale. Fencing tokens keep
	// growing across it.
	Reset(ctx context.Context, key string) error
	// ResetAll is Reset for many keys at once (a catalog's new sales).
	ResetAll(ctx context.Context, keys []string) error
	// AdvanceFence makes every later token of key greater than atLeast:
	// every token the lock service gives from now on, and every token this
	// process hands on locally. (Another process may still hand on tokens
	// it reserved before; the store refuses them and that process advances
	// the fence in turn.)
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
}

// Locked deducts under a distributed lock on the SKU: read, check in Go,
// write.
//
// Invariant (fencing on): a write applies only if no newer holder has
// written the row (fence < token) and the row is still the one the holder
// read (version unchanged), so the stock it checked is the stock it
// deducts from. Fencing orders the writes; the version check validates the
// read. Without the version check this schedule oversells with one unit
// left: A (token 41) reads 1 and stalls past its TTL; B (token 42) reads 1;
// A writes (fence 40 < 41) and commits; B writes (41 < 42) and commits: −1.
// The same happens without any pause when A's COMMIT is still in flight as
// its order gives up and releases the lock. With the check, B's write finds
// the version moved; B's lock is still valid, so it reads again in a fresh
// transaction and answers from what is really left.
type Locked struct {
	name    string
	locker  Locker
	fencing bool
	obs     inventory.Observer
	ping    func(context.Context) error
	freeze  func()
	frozen  atomic.Bool
	lookup  func(ctx context.Context, sku string) error
}

// Option configures Locked.
type Option func(*Locked)

// WithFencing turns the fencing-token check of the write on or off. Default
// on; off exists only to demonstrate what fencing prevents.
func WithFencing(on bool) Option {
	return func(l *Locked) { l.fencing = on }
}

// WithObserver sets who hears about lock waits, holds and fenced-off
// writes. Default: NopObserver.
func WithObserver(o inventory.Observer) Option {
	return func(l *Locked) { l.obs = o }
}

// WithPing sets the readiness check of the lock's backend. Default: none.
func WithPing(ping func(context.Context) error) Option {
	return func(l *Locked) { l.ping = ping }
}

// WithFreezeAfterRead makes the first order this strategy takes call freeze
// between its read and its write, while it holds the lock, and then write
// without heeding the loss of its lock — as a process frozen (SIGSTOP, a
// stalled VM, a long GC pause) with its write already on the way would.
// freeze is expected to stop the whole process, watchdog included, so that
// the lock can expire and another holder take it. It exists to demonstrate
// fencing. Default nil: never.
func WithFreezeAfterRead(freeze func()) Option {
	return func(l *Locked) { l.freeze = freeze }
}

// WithSKULookup makes an order check that its SKU exists before it takes the
// lock, so that requests for unknown SKUs leave no lock keys or fencing
// counters behind in Redis. lookup returns an error wrapping ErrUnknownSKU
// for an unknown SKU. Default: none (every order takes the lock).
func WithSKULookup(lookup func(ctx context.Context, sku string) error) Option {
	return func(l *Locked) { l.lookup = lookup }
}

// New returns a lock strategy named name (one of strategies.LockNames)
// over locker.
func New(name string, locker Locker, opts ...Option) *Locked {
	l := &Locked{name: name, locker: locker, fencing: true, obs: inventory.NopObserver{}}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Strategy implements Strategic: a deduction under the lock, a new sale frees
// the lock, the readiness check asks the lock's backend.
func (l *Locked) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: l.name, Deduct: l.Deduct, ResetSKU: l.ResetSKU, ResetSKUs: l.ResetSKUs, Ping: l.Ping}
}

func lockKey(sku string) string { return "sku:" + sku }

// staleReadAttempts bounds the transactions one holder runs when its writes
// keep finding the row changed since its read. Under a valid lock only a
// writer outside the lock changes it (another strategy on the same SKU, the
// late commit of an earlier holder), so a second attempt nearly always
// succeeds.
const staleReadAttempts = 5

// Deduct implements Strategy.
func (l *Locked) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
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
		lost := errors.Is(relErr, ErrLockLost)
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
	for attempt := 1; ; attempt++ {
		err = inTx(txCtx, func(ctx context.Context, tx inventory.StockTx) error {
			level, err := tx.ReadLevel(ctx, sku)
			if err != nil {
				return err
			}
			rowFence = level.Fence
			// The fence first: a holder that a newer one overtook has
			// lost its lock, and what it reads decides nothing.
			if l.fencing && level.Fence >= lease.Token() {
				return fmt.Errorf("%w: token %d on %q, which holder %d wrote", inventory.ErrFencedOff, lease.Token(), sku, level.Fence)
			}
			if err := level.Refusal(quantity); err != nil {
				return err
			}
			if freeze {
				l.freeze()
			}
			if !l.fencing {
				return tx.Deduct(ctx, sku, quantity)
			}
			ok, err := tx.DeductIfFenced(ctx, sku, quantity, lease.Token(), level.Version)
			if err != nil {
				return err
			}
			if !ok {
				// A newer holder wrote, or someone changed the row
				// since the read: the next attempt's read tells which.
				return fmt.Errorf("%w: %q since the read, with token %d", inventory.ErrVersionMoved, sku, lease.Token())
			}
			return nil
		})
		freeze = false
		if !errors.Is(err, inventory.ErrVersionMoved) {
			break
		}
		// Each attempt is a transaction of its own, so it reads a fresh
		// snapshot (MariaDB's REPEATABLE READ would hand the old one back
		// inside the same transaction). It runs only while the lock is
		// still ours: the lease's context ends when it is lost.
		if attempt == staleReadAttempts || txCtx.Err() != nil {
			err = fmt.Errorf("%w: %w (%d attempts)", inventory.ErrBusy, err, attempt)
			break
		}
	}
	if errors.Is(err, inventory.ErrFencedOff) {
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

// lockError files a failed acquisition: a lock service that failed is
// ErrUnavailable, anything else (a lock held by others past the wait) is
// contention. Either way the order fails closed.
func lockError(err error) error {
	if errors.Is(err, inventory.ErrUnavailable) || errors.Is(err, inventory.ErrBusy) {
		return err
	}
	return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
}

// ResetSKU frees the SKU's lock for a new sale. The fence counter is kept
// (tokens only grow), as StartSale keeps the row's fence.
func (l *Locked) ResetSKU(ctx context.Context, sku string) error {
	return l.locker.Reset(ctx, lockKey(sku))
}

// ResetSKUs is ResetSKU for many SKUs (a catalog's start), in as few
// round trips as the lock's backend allows.
func (l *Locked) ResetSKUs(ctx context.Context, skus []string) error {
	keys := make([]string, len(skus))
	for i, sku := range skus {
		keys[i] = lockKey(sku)
	}
	return l.locker.ResetAll(ctx, keys)
}

// Ping checks the lock's backend.
func (l *Locked) Ping(ctx context.Context) error {
	if l.ping == nil {
		return nil
	}
	if err := l.ping(ctx); err != nil {
		return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
	}
	return nil
}
