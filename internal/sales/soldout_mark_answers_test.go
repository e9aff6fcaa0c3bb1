package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// loseNextCommitAnswer is a store whose next transaction, once armed,
// commits and then answers ErrOutcomeUnknown: the commit landed, its answer
// was lost (a connection reset after COMMIT).
type loseNextCommitAnswer struct {
	inventory.Store
	armed atomic.Bool
}

func (s *loseNextCommitAnswer) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	err := s.Store.InTx(ctx, fn)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		return fmt.Errorf("%w: connection reset after COMMIT (review test)", inventory.ErrOutcomeUnknown)
	}
	return err
}

// TestSoldOutMarkIsClearedByACancelWhoseCommitAnswerWasLost: "a change
// through this instance clears its mark at once". A cancel on instance a
// whose COMMIT landed but whose answer was lost is resolved by
// resolveSettle's second look (answered 200 cancelled), but that branch
// returns (false, &now, nil) and settle never calls settled/unitsBack: the
// unit is back through a, a's mark stays, and a's next order is answered
// sold out (for up to SOLD_OUT_TTL) while the unit sits there. (The same
// branch also skips the relay for the reservation strategies and the
// OrderSettled count.)
func TestSoldOutMarkIsClearedByACancelWhoseCommitAnswerWasLost(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := &loseNextCommitAnswer{Store: testdb.New(t, engine, 4)}
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			a := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour),
				sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
			if err := a.StartSale(ctx, "s", 1); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond) // a refusal at the sale's own reading marks nothing
			held, err := order(t, a, "s", "u1", "")
			if err != nil {
				t.Fatalf("the only unit: %v", err)
			}
			clock.step(time.Millisecond)
			if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("past the stock: %v, want sold out", err)
			}
			db.armed.Store(true)
			got, err := a.CancelOrder(ctx, held.ID, "u1")
			if err != nil || got.State != inventory.OrderCancelled {
				t.Fatalf("cancel whose commit answer was lost: %+v, %v; want cancelled", got, err)
			}
			if level, err := a.Level(ctx, "s"); err != nil || level.Available != 1 {
				t.Fatalf("after the cancel: %+v, %v; want 1 available", level, err)
			}
			// Same instant on a's clock: only a clear lets this through.
			if _, err := order(t, a, "s", "u3", ""); err != nil {
				t.Errorf("the unit a's own cancel gave back (answered 200 cancelled): %v; want 201 (the mark should have been cleared at once)", err)
			}
		})
	}
}

// TestSoldOutMarkAnswersABuyerAtTheLimitAsTheStoreWould: with
// PER_USER_LIMIT 2 the store claims the buyer's units before it deducts,
// so a buyer already holding 2 units is answered limit_reached whatever
// the stock. A marked instance answers the same request sold_out (409
// sold_out invites a retry once units come back, which can never succeed
// for this buyer); an unmarked one answers limit_reached at the same
// moment. TestSoldOutMarkDoesNotAnswerAnOrderPastTheLimit covers only
// quantity > limit, which placeOrder answers before the mark.
func TestSoldOutMarkAnswersABuyerAtTheLimitAsTheStoreWould(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 4)
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			a := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(2), sales.WithClock(clock.now))
			b := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(2))
			if err := a.StartSale(ctx, "s", 2); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond)
			if _, err := a.PlaceOrder(ctx, inventory.Request{SKU: "s", Quantity: 2, UserID: "u1"}); err != nil {
				t.Fatalf("both units to u1: %v", err)
			}
			if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("past the stock: %v, want sold out", err)
			}
			req := inventory.Request{SKU: "s", Quantity: 1, UserID: "u1"}
			if _, err := b.PlaceOrder(ctx, req); !errors.Is(err, inventory.ErrLimitReached) {
				t.Fatalf("u1 at its limit, unmarked instance: %v, want limit reached", err)
			}
			if _, err := a.PlaceOrder(ctx, req); !errors.Is(err, inventory.ErrLimitReached) {
				t.Errorf("u1 at its limit, marked instance: %v, want limit reached (as the store and the unmarked instance answer)", err)
			}
		})
	}
}

// loseStartAnswer is a store whose next start, once armed, starts the sale
// and then answers ErrOutcomeUnknown (its commit answer lost).
type loseStartAnswer struct {
	inventory.Store
	armed atomic.Bool
}

func (s *loseStartAnswer) StartSaleWith(ctx context.Context, st inventory.SaleStart) (int64, error) {
	sale, err := s.Store.StartSaleWith(ctx, st)
	if err == nil && s.armed.CompareAndSwap(true, false) {
		return 0, fmt.Errorf("%w: connection reset after COMMIT (review test)", inventory.ErrOutcomeUnknown)
	}
	return sale, err
}

// TestSoldOutMarkIsClearedByASaleStartWhoseAnswerWasLost: a new sale
// started through the instance lifts its mark at once, and so does one
// whose outcome is unknown (it may have landed): before, only a start
// answered in time cleared it, and the new sale's units were refused sold
// out for up to SOLD_OUT_TTL by the old sale's mark (found by review).
func TestSoldOutMarkIsClearedByASaleStartWhoseAnswerWasLost(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := &loseStartAnswer{Store: testdb.New(t, engine, 4)}
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			a := sales.NewService(db, sqlrow.NewConditional(), sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
			if err := a.StartSale(ctx, "s", 1); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond)
			if _, err := order(t, a, "s", "u1", ""); err != nil {
				t.Fatalf("the only unit: %v", err)
			}
			clock.step(time.Millisecond)
			if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("past the stock: %v, want sold out", err)
			}
			db.armed.Store(true)
			if err := a.StartSale(ctx, "s", 1); !errors.Is(err, inventory.ErrOutcomeUnknown) {
				t.Fatalf("the new sale whose answer was lost: %v, want outcome unknown", err)
			}
			// Same instant on a's clock: only a clear lets this through.
			if _, err := order(t, a, "s", "u3", ""); err != nil {
				t.Errorf("the new sale's unit (the start landed, its answer lost): %v; want 201 (the mark lifted at once)", err)
			}
		})
	}
}
