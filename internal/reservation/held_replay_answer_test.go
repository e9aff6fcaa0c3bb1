package reservation_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
)

// TestReplayOfAHeldOrderAnswersItAsStored: claim 5 for a retry with the
// same Idempotency-Key on redis-reserve (HOLD_TTL 1 min). Schedule:
//
//  1. buyer b: POST /orders, key K -> 201 {id O, held, expires_at T}.
//  2. the consumer writes O; b pays it (GET says paid, expires_at T).
//  3. b's client retries the POST with K (its first answer was lost to
//     the client): the script answers {"replay", O}; TakeOrder answers
//     the new request's template with O's id: held, no expires_at.
//
// The replay must answer the order as GET /orders/O does.
func TestReplayOfAHeldOrderAnswersItAsStored(t *testing.T) {
	s := newSaleIn(t, "postgres", modes[0])
	ctx := context.Background()
	const sku = "replay-held"
	s.start(sku, 5)
	svc := sales.NewService(s.db, reservation.NewReserved(s.res, s.db), sales.WithHoldTTL(time.Minute))
	s.consume(s.db)
	req := inventory.Request{SKU: sku, Quantity: 1, UserID: "b", IdempotencyKey: "replay-held-1"}
	first, err := svc.PlaceOrder(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s.drained(sku, 1)
	if _, err := svc.PayOrder(ctx, first.ID, "b"); err != nil {
		t.Fatal(err)
	}
	again, err := svc.PlaceOrder(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := svc.FindOrder(ctx, first.ID, "b")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first 201: %s %v; replay: %s %v; GET: %s %v", first.State, first.ExpiresAt, again.State, again.ExpiresAt, stored.State, stored.ExpiresAt)
	if again.State != stored.State || !again.ExpiresAt.Equal(stored.ExpiresAt) {
		t.Errorf("the replay answered %s (expires_at %v), the order is %s (expires_at %v)", again.State, again.ExpiresAt, stored.State, stored.ExpiresAt)
	}
}
