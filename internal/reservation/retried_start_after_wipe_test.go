package reservation_test

import (
	"context"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// TestRetriedStartNeverReopensASaleWhoseUnwrittenOrdersRedisLost: claim 1
// on redis-reserve/redis-watch ("a retried start ... never reopens a sale
// whose orders were taken (Redis wiped ...)"). Schedule:
//
//  1. admin: PUT /admin/stock/s {available: 3}, Idempotency-Key K: the
//     database commits sale E (key K), Redis loads it; the answer is lost
//     to the admin (a proxy timeout).
//  2. buyers b1..b3 take the 3 units: 201 each; the orders are in Redis's
//     stream, not yet in the database (the consumer lags, or the database
//     is slow: the same trouble that lost the admin's answer).
//  3. Redis loses its data (FLUSHALL, or a restart on an empty volume).
//  4. admin retries PUT with K: FindAdminKey finds it, FinishStart sees
//     no sale in Redis and no order in the database, and loads sale E
//     again with 3 units.
//  5. b4..b6 take the same 3 units: 6 units promised (201) for 3.
//
// Without the retry the sale stays closed (503) until a new sale is
// started; with it the start must not reopen a sale that sold.
func TestRetriedStartNeverReopensASaleWhoseUnwrittenOrdersRedisLost(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		ctx := context.Background()
		const sku = "wiped"
		req := inventory.SaleRequest{SKU: sku, Available: 3, IdempotencyKey: "start-wiped-1"}
		if _, err := s.svc.OpenSale(ctx, req); err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{"b1", "b2", "b3"} {
			if _, err := s.order(sku, 1, u, ""); err != nil {
				t.Fatalf("%s: %v", u, err)
			}
		}
		if err := s.rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		started, err := s.svc.OpenSale(ctx, req)
		t.Logf("the retried start: %+v, %v", started, err)
		resold := 0
		for _, u := range []string{"b4", "b5", "b6"} {
			if _, err := s.order(sku, 1, u, ""); err == nil {
				resold++
			}
		}
		if resold > 0 {
			t.Errorf("the retried start reopened sale %q after Redis lost the 3 units it had sold (201s): %d more units sold, %d promised for 3", sku, resold, 3+resold)
		}
	})
}
