package inventorylock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locking/semaphore"
	"github.com/flashsale/stock/internal/sqlrow"
)

// Admission returns sem as the domain's Admission (ADMISSION_LIMIT): one
// place of "sku:<sku>" per order. A wait that ended is the semaphore's
// ErrNotAdmitted (the domain answers it busy); a failing Redis is
// inventory.ErrUnavailable.
func Admission(sem *semaphore.Semaphore) sqlrow.Admission { return admission{sem} }

type admission struct{ sem *semaphore.Semaphore }

func (a admission) Enter(ctx context.Context, sku string) (func(), error) {
	p, err := a.sem.Acquire(ctx, "sku:"+sku)
	if err != nil {
		if errors.Is(err, semaphore.ErrNotAdmitted) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
	}
	return func() {
		// The order's deadline may have passed: the place is given back
		// anyway, or it stays taken until the permit's lease ends.
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = p.Release(rctx)
	}, nil
}

// Ping checks the semaphore's Redis.
func (a admission) Ping(ctx context.Context) error { return a.sem.Ping(ctx) }
