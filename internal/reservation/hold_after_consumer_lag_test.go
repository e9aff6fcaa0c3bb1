package reservation_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
)

// TestHeldOrderCanBePaidAfterTheConsumerCatchesUp: claim 5's second half
// ("a hold shorter than HOLD_TTL on the database's clock in a way that
// matters"). redis-reserve, HOLD_TTL 2 s. Schedule:
//
//  1. buyer b: POST /orders -> 201, expires_at = Redis's time + 2 s.
//  2. the consumer lags 2.5 s (the database slow or down; a consumer
//     restart): the order is not in the database, so it cannot be paid.
//  3. the consumer writes it with that expires_at, already past on the
//     database's clock; b pays at once: 409 expired.
//
// Before this change the hold ran from the write (the buyer's whole
// HOLD_TTL to pay); now the hold the buyer can use is HOLD_TTL minus the
// consumer's lag (and minus Redis's clock lag behind the database's),
// down to nothing.
func TestHeldOrderCanBePaidAfterTheConsumerCatchesUp(t *testing.T) {
	s := newSaleIn(t, "postgres", modes[0])
	ctx := context.Background()
	const sku = "lagged-hold"
	s.start(sku, 5)
	svc := sales.NewService(s.db, reservation.NewReserved(s.res, s.db), sales.WithHoldTTL(2*time.Second))
	placed, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the consumer's lag
	s.consume(s.db)
	s.drained(sku, 1)
	paid, err := svc.PayOrder(ctx, placed.ID, "b")
	t.Logf("201 expires_at %v; pay right after the write: %+v %v", placed.ExpiresAt, paid.State, err)
	if err != nil {
		t.Errorf("the buyer paid as soon as the order could be paid, and was refused: %v", err)
	}
}
