package sales_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// pausingStrategy is a real strategy whose next Deduct, once armed, tells
// the test its answer is in (the store has read and refused) and waits
// for the test before the service sees it: a refusal answered late.
type pausingStrategy struct {
	inventory.Strategic
	armed    atomic.Bool
	answered chan error
	proceed  chan struct{}
}

func newPausingStrategy(s inventory.Strategic) *pausingStrategy {
	return &pausingStrategy{Strategic: s, answered: make(chan error, 1), proceed: make(chan struct{})}
}

func (p *pausingStrategy) Strategy() inventory.Strategy {
	st := p.Strategic.Strategy()
	inner := st.Deduct
	st.Deduct = func(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
		err := inner(ctx, sku, quantity, inTx)
		if p.armed.CompareAndSwap(true, false) {
			p.answered <- err
			<-p.proceed
		}
		return err
	}
	return st
}

// TestSoldOutMarkIsNotSetByARefusalReadBeforeALocalRestock: an order is
// sent, the store reads the stock (none) and refuses it; before the
// service hears the refusal, a restock commits through the same instance
// and clears the SKU's mark; then the refusal arrives. The refusal is
// older than the restock (its read came before the restock's commit), so
// it must be ignored, and the restocked unit must be sold to the next
// order. note ignores only a refusal sent strictly before the clear
// (seen.Before(clearedAt)): when the clock reads the same at the send and
// at the clear (a clock that a scheduler steps, as WithClock invites, or
// a coarse one), the late refusal marks the SKU again and the instance
// refuses the unit it just restocked for the whole TTL.
func TestSoldOutMarkIsNotSetByARefusalReadBeforeALocalRestock(t *testing.T) {
	for _, engine := range store.Engines {
		for _, c := range []struct {
			name string
			step time.Duration // how far the clock moves between the send and the clear
		}{{"clock moved", time.Nanosecond}, {"same clock reading", 0}} {
			t.Run(engine+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 4)
				strategy := newPausingStrategy(sqlrow.NewConditional())
				clock := &handClock{t: time.Unix(1_000_000, 0)}
				svc := sales.NewService(db, strategy, sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
				ctx := context.Background()
				if err := svc.StartSale(ctx, "s", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := order(t, svc, "s", "u1", ""); err != nil {
					t.Fatalf("the only unit: %v", err)
				}
				strategy.armed.Store(true)
				late := make(chan error, 1)
				go func() {
					_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s", Quantity: 1, UserID: "u2"})
					late <- err
				}()
				select {
				case err := <-strategy.answered:
					if !errors.Is(err, inventory.ErrSoldOut) {
						close(strategy.proceed)
						t.Fatalf("the store's answer to u2: %v, want sold out", err)
					}
				case <-time.After(20 * time.Second):
					t.Fatal("u2's order never reached the store")
				}
				clock.step(c.step)
				if _, err := svc.Restock(ctx, "s", 1); err != nil {
					close(strategy.proceed)
					t.Fatal(err)
				}
				close(strategy.proceed)
				if err := <-late; !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("u2, read before the restock: %v, want sold out", err)
				}
				if _, err := order(t, svc, "s", "u3", ""); err != nil {
					t.Errorf("after the instance's own restock, the restocked unit: %v (a refusal read before the restock marked the SKU again)", err)
				}
			})
		}
	}
}

// TestSoldOutMarkGivesWayToAWindowStartedElsewhere: a is marked sold out;
// b starts a new sale whose window has not opened. Within the TTL a may
// still answer from its mark (sold out: the bound the mark documents for
// changes through another instance); from the TTL on it asks and answers
// not started. a's own new sale with a window answers not started at once.
// (Passes: covers windows, which the other mark tests do not.)
func TestSoldOutMarkGivesWayToAWindowStartedElsewhere(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, b *sales.Service, clock *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(time.Millisecond) // a refusal at the sale's own reading marks nothing
		if _, err := order(t, a, "s", "u1", ""); err != nil {
			t.Fatalf("the only unit: %v", err)
		}
		if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v", err)
		}
		later := inventory.SaleWindow{StartsAt: time.Now().Add(time.Hour)}
		if err := b.StartSaleWindow(ctx, "s", 5, later); err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, a, "s", "u3", ""); !errors.Is(err, inventory.ErrSoldOut) && !errors.Is(err, inventory.ErrSaleNotStarted) {
			t.Errorf("within the TTL, a sale not started elsewhere: %v, want sold out (the mark) or not started", err)
		}
		clock.step(time.Second)
		if _, err := order(t, a, "s", "u4", ""); !errors.Is(err, inventory.ErrSaleNotStarted) {
			t.Errorf("past the TTL, a sale not started: %v, want not started", err)
		}
		// a's own window: not started at once.
		if err := b.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, b, "s", "u5", ""); err != nil {
			t.Fatalf("the only unit of the next sale: %v", err)
		}
		if _, err := order(t, a, "s", "u6", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v, want sold out", err)
		}
		if err := a.StartSaleWindow(ctx, "s", 5, later); err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, a, "s", "u7", ""); !errors.Is(err, inventory.ErrSaleNotStarted) {
			t.Errorf("after a's own new sale with a window: %v, want not started", err)
		}
	})
}

// TestSoldOutMarkDoesNotAnswerAnOrderPastTheLimit: with PER_USER_LIMIT 2,
// an order of 3 can never be taken and is answered limit_reached without
// a transaction. The mark is consulted first: on an instance marked by a
// refusal of 1 unit, the same order is answered sold_out, which tells the
// buyer that a restock or a return could serve it (409 sold_out is the
// answer a client retries after units come back), and an instance without
// a mark answers limit_reached to the same request at the same moment.
func TestSoldOutMarkDoesNotAnswerAnOrderPastTheLimit(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			a := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(2), sales.WithClock(clock.now))
			b := sales.NewService(db, sqlrow.NewConditional(), sales.WithPerUserLimit(2))
			ctx := context.Background()
			if err := a.StartSale(ctx, "s", 1); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond) // a refusal at the sale's own reading marks nothing
			if _, err := order(t, a, "s", "u1", ""); err != nil {
				t.Fatalf("the only unit: %v", err)
			}
			if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("past the stock: %v", err)
			}
			req := inventory.Request{SKU: "s", Quantity: 3, UserID: "u3"}
			if _, err := b.PlaceOrder(ctx, req); !errors.Is(err, inventory.ErrLimitReached) {
				t.Fatalf("3 units past a limit of 2, unmarked instance: %v, want limit reached", err)
			}
			if _, err := a.PlaceOrder(ctx, req); !errors.Is(err, inventory.ErrLimitReached) {
				t.Errorf("3 units past a limit of 2, marked instance: %v, want limit reached (as the unmarked one answers)", err)
			}
		})
	}
}
