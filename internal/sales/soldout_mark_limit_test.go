package sales_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// TestSoldOutMarkUnderALimitAnswersFromTheBuyersUnits: under
// PER_USER_LIMIT the mark answers too (a sale's sold-out answers are most
// of its answers, and asking the store for each cost the limited burst
// half its rate), reading only the buyer's units where the strategy
// counts them (the database's buyer_units, or Redis for the reservation
// strategies): a buyer at the limit is answered limit_reached, as the
// store answers it, and any other sold_out without the store being asked,
// so a unit restocked through another instance stays refused to the
// marked one within the mark's bound, as without a limit.
func TestSoldOutMarkUnderALimitAnswersFromTheBuyersUnits(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, b *sales.Service, clock *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(time.Millisecond)
		if _, err := order(t, a, "s", "u1", ""); err != nil {
			t.Fatalf("the only unit: %v", err)
		}
		if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v, want sold out (which marks a)", err)
		}
		if _, err := b.Restock(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(100 * time.Millisecond) // in the mark's first half
		if _, err := order(t, a, "s", "u1", ""); !errors.Is(err, inventory.ErrLimitReached) {
			t.Errorf("u1, at its limit, on the marked instance: %v; want limit reached, as the store answers", err)
		}
		if _, err := order(t, a, "s", "u3", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Errorf("u3 on the marked instance within the mark's bound: %v; want sold out without asking the store (which has the restocked unit)", err)
		}
		if _, err := order(t, b, "s", "u3", ""); err != nil {
			t.Errorf("u3 on the unmarked instance: %v; want the restocked unit", err)
		}
		if level, err := b.Level(ctx, "s"); err != nil || level.Available != 0 {
			t.Errorf("after the restocked unit was sold: %+v, %v; want 0 available", level, err)
		}
	}, sales.WithPerUserLimit(1))
}

// TestSoldOutMarkUnderALimitAnswersAsTheStoreDoes: the mark's answers
// under a limit read as the store's: a buyer row written before ids with
// trailing spaces were refused ('pad ') is one buyer with 'pad' on
// MariaDB, whose collation pads, and two on PostgreSQL, for the mark as
// for the store's claim; and its sold_out says what the mark says without
// a limit, not the mark's internal text (found by review).
func TestSoldOutMarkUnderALimitAnswersAsTheStoreDoes(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, raw := dbWithRawAccess(t, engine, 4)
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			a := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(1), sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
			b := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(1))
			noLimit := sales.NewService(db, sqlrow.NewConditional(), sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
			ctx := context.Background()
			if err := a.StartSale(ctx, "s", 2); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond)
			place(t, a, "s", "pad", 1)
			raw.exec(t, `UPDATE buyer_units SET user_id = 'pad ' WHERE user_id = 'pad'`, `UPDATE buyer_units SET user_id = 'pad ' WHERE user_id = 'pad'`)
			place(t, a, "s", "x", 1)
			for _, svc := range []*sales.Service{a, noLimit} {
				if _, err := order(t, svc, "s", "y", ""); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("y past the stock: %v; want sold out (which marks the instance)", err)
				}
			}
			clock.step(100 * time.Millisecond)
			_, atMark := order(t, a, "s", "pad", "")
			_, atStore := order(t, b, "s", "pad", "")
			if errors.Is(atMark, inventory.ErrLimitReached) != errors.Is(atStore, inventory.ErrLimitReached) {
				t.Errorf("'pad' with a row of 'pad ': the mark answers %v, the store %v", atMark, atStore)
			}
			_, limited := order(t, a, "s", "z", "")
			_, unlimited := order(t, noLimit, "s", "z", "")
			if limited == nil || unlimited == nil || limited.Error() != unlimited.Error() {
				t.Errorf("the mark's sold_out under a limit: %v; without one: %v; want the same words", limited, unlimited)
			}
		})
	}
}
