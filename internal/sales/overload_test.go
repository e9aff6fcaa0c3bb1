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
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// TestNoOrderIsUnknownToItsBuyerAfterAnOverload: three hundred buyers at
// once on a pool of two connections, each order allowed 30 ms: most are
// answered 503. Afterwards every buyer lists their orders, and the
// answers hold: a 201's order is listed; a 503 that says nothing was
// deducted (busy, or unavailable with the commit known not to have
// landed) has no order; only a 503 whose commit stayed unknown may have
// one; a 409 has none. So no buyer holds an order they cannot find, and
// none was told "not taken" for an order that exists.
func TestNoOrderIsUnknownToItsBuyerAfterAnOverload(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameBatched} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				ctx := context.Background()
				db := testdb.New(t, engine, 2)
				svc := sales.NewService(db, builders()[name](t, engine, db), sales.WithOrderTimeout(30*time.Millisecond))
				if err := svc.StartSale(ctx, "overload", 100); err != nil {
					t.Fatal(err)
				}
				const buyers = 300
				answers := make([]error, buyers)
				taken := make([]inventory.Order, buyers)
				var wg sync.WaitGroup
				for i := range buyers {
					wg.Go(func() {
						taken[i], answers[i] = svc.PlaceOrder(ctx, inventory.Request{SKU: "overload", Quantity: 1, UserID: fmt.Sprintf("b-%03d", i)})
					})
				}
				wg.Wait()
				// The buyers look later, with time to read: the overload's
				// 30 ms are the orders', and the listing is not under test
				// (a listing after it ran out of them on a loaded machine).
				reader := sales.NewService(db, sqlrow.NewConditional())
				counts := map[string]int{}
				listed := 0
				for i, err := range answers {
					page, lerr := reader.ListOrders(ctx, fmt.Sprintf("b-%03d", i), "overload", "", 0)
					if lerr != nil {
						t.Fatalf("list b-%03d: %v", i, lerr)
					}
					n := len(page.Orders)
					listed += n
					switch {
					case err == nil:
						counts["201"]++
						if n != 1 || page.Orders[0].ID != taken[i].ID {
							t.Errorf("b-%03d got 201 %s, lists %+v", i, taken[i].ID, page.Orders)
						}
					case errors.Is(err, inventory.ErrOutcomeUnknown):
						counts["503 unknown"]++
						if n > 1 {
							t.Errorf("b-%03d: %d orders for one request", i, n)
						}
					case errors.Is(err, inventory.ErrBusy), errors.Is(err, inventory.ErrUnavailable):
						counts["503"]++
						if n != 0 {
							t.Errorf("b-%03d was told %v, yet lists %+v: an order its buyer was told was not taken", i, err, page.Orders)
						}
					case errors.Is(err, inventory.ErrSoldOut):
						counts["409"]++
						if n != 0 {
							t.Errorf("b-%03d was told sold out, yet lists %+v", i, page.Orders)
						}
					default:
						t.Errorf("b-%03d: an answer the API does not know: %v", i, err)
					}
				}
				a, err := reader.Audit(ctx, "overload")
				if err != nil {
					t.Fatal(err)
				}
				if !a.Consistent() || int(a.Orders) != listed {
					t.Errorf("audit %+v: %d orders, the buyers list %d", a, a.Orders, listed)
				}
				t.Logf("%v; %d orders", counts, a.Orders)
			})
		}
	}
}
