package sales_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// TestBatchesAcrossSKUsNeverDeadlock: two instances of batched, every SKU
// in one lane and no second attempt for a batch, take 1,600 orders from
// 64 buyers spread over the same 12 SKUs in random orders: every batch
// spans SKUs, and the two instances' batches share them. Each is answered
// 201 or sold out, none busy (a deadlock's victim would be, with one
// attempt), and every SKU sells exactly its stock, on both engines.
func TestBatchesAcrossSKUsNeverDeadlock(t *testing.T) {
	const skus, stock, buyers, orders = 12, 100, 64, 1600
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.New(t, engine, 16)
			var svcs []*sales.Service
			for range 2 {
				b := batched.New(db, batched.WithLanes(1), batched.WithTxAttempts(1))
				svcs = append(svcs, sales.NewService(db, b, sales.WithOrderTimeout(30*time.Second)))
			}
			req := inventory.CatalogRequest{}
			for i := range skus {
				req.Sales = append(req.Sales, inventory.SaleRequest{SKU: fmt.Sprintf("across-%02d", i), Available: stock})
			}
			if _, err := svcs[0].OpenCatalog(ctx, req); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			sold := map[string]int64{}
			var wg sync.WaitGroup
			for w := range buyers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for n := range orders / buyers {
						sku := req.Sales[rng.IntN(skus)].SKU
						o, err := svcs[w%2].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("u%d-%d", w, n)})
						switch {
						case err == nil:
							mu.Lock()
							sold[o.SKU]++
							mu.Unlock()
						case inventory.Outcome(err) == "sold_out":
						default:
							t.Errorf("order of %s: %v", sku, err)
						}
					}
				})
			}
			wg.Wait()
			for _, s := range req.Sales {
				a, err := db.Audit(ctx, s.SKU)
				if err != nil || !a.Consistent() || a.Ordered != sold[s.SKU] || a.Available < 0 {
					t.Errorf("%s: audit %+v (%v), %d sold by the answers", s.SKU, a, err, sold[s.SKU])
				}
			}
		})
	}
}
