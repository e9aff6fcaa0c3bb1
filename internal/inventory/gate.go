package inventory

import (
	"context"
	"fmt"

	"github.com/flashsale/stock/internal/keygate"
)

// RowGated is a strategy whose orders on one SKU enter their transaction at
// most n at a time in this process; the rest wait in the process, holding
// no pooled connection, until a place frees or their deadline passes.
//
// Why: for-update, conditional and naive queue on the SKU's row inside the
// database, each waiter holding a pooled connection (and, on PostgreSQL, a
// backend). Without a bound, a flood on one SKU takes every connection of
// the pool and orders on every other SKU wait behind it. The bound is per
// process and per SKU: instances still share the row, and other SKUs keep
// the rest of the pool.
type RowGated struct {
	decorated
	gate *keygate.Gate
}

// LimitRowWork returns s with at most n orders per SKU in their transaction
// at once in this process (RowGated). An order that cannot enter before its
// deadline fails with ErrBusy, having touched nothing. n <= 0 returns s
// itself: no bound, which is what the strategies' constructors give. It
// refuses a strategy that takes whole orders or keeps its own books (an
// OrderTaker, SaleKeeper, Auditor or Leveler): its orders would never pass
// the gate, and a wrapper that dropped those capabilities would turn it
// into another strategy.
func LimitRowWork(s Strategy, n int) (Strategy, error) {
	if err := wrappable("LimitRowWork", s); err != nil {
		return nil, err
	}
	if n <= 0 {
		return s, nil
	}
	return &RowGated{decorated: decorated{s}, gate: keygate.New(n)}, nil
}

// wrappable refuses to wrap a strategy with a capability a wrapper cannot
// pass on: the wrappers (RowGated, Admitted) act in Deduct, and forward
// only Name, ResetSKU and Ping.
func wrappable(wrapper string, s Strategy) error {
	var has string
	switch s.(type) {
	case OrderTaker:
		has = "takes whole orders (OrderTaker)"
	case SaleKeeper:
		has = "keeps its own sales (SaleKeeper)"
	case Auditor:
		has = "audits itself (Auditor)"
	case Leveler:
		has = "reports its own stock (Leveler)"
	default:
		return nil
	}
	return fmt.Errorf("inventory: %s cannot wrap %s: it %s, which the wrapper would not pass on", wrapper, s.Name(), has)
}

// Inner is the strategy the gate bounds.
func (r *RowGated) Inner() Strategy { return r.inner }

// Deduct implements Strategy.
func (r *RowGated) Deduct(ctx context.Context, sku string, quantity int64, inTx TxRunner) error {
	leave, err := r.gate.Enter(ctx, sku)
	if err != nil {
		return fmt.Errorf("%w: waiting for a place among the orders on %q: %w", ErrBusy, sku, err)
	}
	defer leave()
	return r.inner.Deduct(ctx, sku, quantity, inTx)
}

// decorated is what a strategy wrapper (RowGated, Admitted) passes on to
// the strategy it wraps: its name, a new sale, the readiness check.
type decorated struct{ inner Strategy }

// Name implements Strategy: the name of the wrapped strategy.
func (d decorated) Name() string { return d.inner.Name() }

// ResetSKU passes a new sale on to the wrapped strategy, if it keeps state.
func (d decorated) ResetSKU(ctx context.Context, sku string) error {
	if s, ok := d.inner.(SKUStateResetter); ok {
		return s.ResetSKU(ctx, sku)
	}
	return nil
}

// Ping checks the wrapped strategy's own backends, if it has any.
func (d decorated) Ping(ctx context.Context) error {
	if p, ok := d.inner.(Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}
