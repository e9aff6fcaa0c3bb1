package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
)

// TestSaleRestartRacingExpiriesAndCancelsAnswersKnownErrors: a new sale
// started while the old sale's holds are being expired by the sweep and
// cancelled by their buyers takes the stock row and then the SKU's order
// rows; the expiries and cancels take an order row and then the stock
// row: the database picks deadlock victims. Every start answers a sale
// started or busy (a 503), never an error the API does not know (with
// redis-reserve on PostgreSQL, 5 starts of 9 answered 500 "deadlock
// detected"), and the audit stays consistent.
func TestSaleRestartRacingExpiriesAndCancelsAnswersKnownErrors(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameRedisReserve} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db, raw := dbWithRawAccess(t, engine, 8)
				svc := sales.NewService(db, builders()[name](t, engine, db), sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(10*time.Second))
				for round := range 3 {
					if err := svc.StartSale(ctx, "restart", 120); err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					var orders []inventory.Order
					for i := range 120 {
						orders = append(orders, place(t, svc, "restart", fmt.Sprintf("r%d-b%d", round, i), 1))
					}
					auditSettled(t, svc, "restart")
					var lapsed []string
					for i, o := range orders {
						if i%2 == 0 {
							lapsed = append(lapsed, o.ID)
						}
					}
					raw.lapse(t, lapsed...)
					var wg sync.WaitGroup
					wg.Go(func() { _, _ = svc.ExpireHolds(ctx, 20) })
					for i, o := range orders {
						if i%2 == 1 {
							wg.Go(func() { _, _ = svc.CancelOrder(ctx, o.ID, o.UserID) })
						}
					}
					err := svc.StartSale(ctx, "restart", 120)
					wg.Wait()
					if err != nil && !errors.Is(err, inventory.ErrBusy) {
						t.Errorf("round %d: the restart answered %v, want a started sale or busy", round, err)
					}
					if a := auditSettled(t, svc, "restart"); !a.Consistent() {
						t.Errorf("round %d: audit %+v", round, a)
					}
				}
			})
		}
	}
}
