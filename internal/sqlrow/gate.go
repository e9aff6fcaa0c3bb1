package sqlrow

import (
	"context"
	"fmt"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/keygate"
)

// LimitRowWork returns s with at most n orders per SKU in their transaction
// at once in this process. An order that cannot enter before its deadline
// fails with ErrBusy, having touched nothing. n <= 0 returns s itself: no
// bound, which is what the strategies' constructors give. Every other
// capability of s is s's (the struct is copied). It refuses a strategy
// that takes whole orders: their transactions are its own, and would
// never pass the gate.
//
// Why: for-update, conditional and naive queue on the SKU's row inside the
// database, each waiter holding a pooled connection (and, on PostgreSQL, a
// backend). Without a bound, a flood on one SKU takes every connection of
// the pool and orders on every other SKU wait behind it. The bound is per
// process and per SKU: instances still share the row, and other SKUs keep
// the rest of the pool.
func LimitRowWork(s inventory.Strategic, n int) (inventory.Strategy, error) {
	st := s.Strategy()
	if st.Deduct == nil {
		return inventory.Strategy{}, fmt.Errorf("sqlrow: LimitRowWork cannot bound %s: it takes whole orders, in transactions of its own", st.Name)
	}
	if n <= 0 {
		return st, nil
	}
	gate, inner := keygate.New(n), st.Deduct
	st.Deduct = func(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
		leave, err := gate.Enter(ctx, sku)
		if err != nil {
			return fmt.Errorf("%w: waiting for a place among the orders on %q: %w", inventory.ErrBusy, sku, err)
		}
		defer leave()
		return inner(ctx, sku, quantity, inTx)
	}
	return st, nil
}
