// Package inventorylock fits a lock backend of internal/locking (Redis,
// Redlock, etcd, ZooKeeper) to the Locker that the inventory domain declares.
//
// The domain speaks its own errors: a failed lock service is
// inventory.ErrUnavailable, a lock held by others past the wait is
// inventory.ErrBusy, a lease lost while held is locked.ErrLockLost. The
// backends speak internal/locking's. This is the one place that translates,
// so the domain imports no lock package and every backend files the same
// failure the same way.
package inventorylock

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/locking"
)

// Backend is what a lock backend offers, with its own lease type L.
type Backend[L locked.Lease] interface {
	Acquire(ctx context.Context, key string) (L, error)
	Reset(ctx context.Context, key string) error
	AdvanceFence(ctx context.Context, key string, atLeast int64) error
}

// Adapt returns backend as the domain's Locker.
func Adapt[L locked.Lease](backend Backend[L]) locked.Locker {
	return adapted[L]{backend}
}

type adapted[L locked.Lease] struct{ backend Backend[L] }

var _ locked.Locker = adapted[locked.Lease]{}

func (a adapted[L]) Acquire(ctx context.Context, key string) (locked.Lease, error) {
	l, err := a.backend.Acquire(ctx, key)
	if err != nil {
		// A typed nil in an interface is not nil: never hand one out.
		return nil, AcquireError(err)
	}
	return lease[L]{l}, nil
}

func (a adapted[L]) Reset(ctx context.Context, key string) error {
	return a.backend.Reset(ctx, key)
}

// batchResetter is a backend that resets many keys in fewer round trips
// than one per key (etcd: transactions of deletes; ZooKeeper: one check).
type batchResetter interface {
	ResetAll(ctx context.Context, keys []string) error
}

// resetWidth is how many keys of a backend without a batch reset are reset
// at once.
const resetWidth = 32

// ResetAll resets keys: through the backend's own batch reset when it has
// one, else one Reset per key, resetWidth at once.
func (a adapted[L]) ResetAll(ctx context.Context, keys []string) error {
	if b, ok := any(a.backend).(batchResetter); ok {
		return b.ResetAll(ctx, keys)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resetWidth)
	for _, key := range keys {
		g.Go(func() error { return a.backend.Reset(gctx, key) })
	}
	return g.Wait()
}

func (a adapted[L]) AdvanceFence(ctx context.Context, key string, atLeast int64) error {
	return a.backend.AdvanceFence(ctx, key, atLeast)
}

// lease reports a lock lost before its release as locked.ErrLockLost,
// whether the backend said so in Release's error or only as the cause of
// the lease's context.
type lease[L locked.Lease] struct{ l L }

func (le lease[L]) Token() int64             { return le.l.Token() }
func (le lease[L]) Context() context.Context { return le.l.Context() }

func (le lease[L]) Release(ctx context.Context) error {
	err := le.l.Release(ctx)
	if cause := context.Cause(le.l.Context()); errors.Is(cause, locking.ErrLockLost) && !errors.Is(err, locking.ErrLockLost) {
		err = errors.Join(err, cause)
	}
	if errors.Is(err, locking.ErrLockLost) {
		return fmt.Errorf("%w: %w", locked.ErrLockLost, err)
	}
	return err
}

// AcquireError files a failed acquisition: servers that failed are a
// backend outage (inventory.ErrUnavailable), a lock held by others past
// the wait is contention (inventory.ErrBusy), also when the wait's deadline
// cut a call to a server short. Either way the order fails closed.
func AcquireError(err error) error {
	if serverFailed(err) {
		return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
}

// serverFailed reports whether err holds a locking.NodeError for another
// reason than the caller's deadline or cancellation.
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
