package reservation_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
)

// TestWatchRetryAfterALostExecAnswerCarriesTheHoldsExpiry: claim 5 on
// redis-watch. Schedule (one instance, HOLD_TTL 1 min):
//
//  1. the order's WATCH/MULTI/EXEC applies (the stream entry, whose id is
//     Redis's time of the order, placed:<id> = base); EXEC's reply is lost.
//  2. Reserve retries (an earlier attempt may have run); watchOnce reads
//     placed:<id> == base and answers {"ok", id, ""}: no entry id, so
//     Taken.At is zero and the 201 carries no expires_at.
//  3. the consumer writes the order, its hold running from the write (the
//     later of that and the 201's promise), which GET /orders/{id}
//     returns.
//
// The 201 must carry an expires_at, and the hold GET returns must last at
// least until it: the 201's is the promise (the order's time in Redis plus
// the hold), the database's never earlier.
func TestWatchRetryAfterALostExecAnswerCarriesTheHoldsExpiry(t *testing.T) {
	m := modes[1] // redis-watch
	s := newSaleIn(t, "postgres", m)
	const sku = "lost-exec-hold"
	s.start(sku, 5)
	ctx := context.Background()

	var hook atomic.Pointer[func()]
	lossy := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, Dialer: lossyExecDialer(&hook)})
	t.Cleanup(func() { _ = lossy.Close() })
	svc := sales.NewService(s.db, reservation.NewReserved(reservation.New(lossy, s.db, m.opts...), s.db, reservation.WithReservedName(m.name)),
		sales.WithHoldTTL(time.Minute))
	s.consume(s.db)

	if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "warm"}); err != nil {
		t.Fatal(err)
	}
	nothing := func() {}
	hook.Store(&nothing)
	placed, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "buyer"})
	if hook.Load() != nil {
		t.Fatal("no MULTI/EXEC reply was lost: not the interleaving under test")
	}
	if err != nil {
		t.Fatalf("the order whose EXEC reply was lost: %v", err)
	}
	s.drained(sku, 2)
	stored, err := svc.FindOrder(ctx, placed.ID, "buyer")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("201: state %s expires_at %v; GET: state %s expires_at %v", placed.State, placed.ExpiresAt, stored.State, stored.ExpiresAt)
	if placed.ExpiresAt.IsZero() || stored.ExpiresAt.Before(placed.ExpiresAt) {
		t.Errorf("the 201 said expires_at %v (zero: omitted), GET says %v", placed.ExpiresAt, stored.ExpiresAt)
	}
}
