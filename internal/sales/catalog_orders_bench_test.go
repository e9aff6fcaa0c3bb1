package sales_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// BenchmarkCatalogOrders: 200 goroutines place one-unit orders through one
// service (a pool of 16 connections, no HTTP) on a catalog of 10,000 SKUs
// of 20 units, each order's SKU drawn from a Zipf distribution (s = 1.3,
// as the demo's catalog), beside the same orders on one hot SKU: batched
// with lanes (the default), with a batch per SKU (lanes=0, as before),
// and conditional. Sold-out answers count as answers; orders/s is every
// answer, 201/s the created ones.
//
//	go test -run '^$' -bench CatalogOrders -benchtime 20000x ./internal/sales/
func BenchmarkCatalogOrders(b *testing.B) {
	const skus, stock, buyers = 10_000, 20, 200
	for _, engine := range store.Engines {
		for _, c := range []struct {
			name  string
			build func(db store.Store) inventory.Strategic
		}{
			{"batched", func(db store.Store) inventory.Strategic { return batched.New(db) }},
			{"batched-lanes=0", func(db store.Store) inventory.Strategic { return batched.New(db, batched.WithLanes(0)) }},
			{"conditional", func(store.Store) inventory.Strategic {
				s, _ := sqlrow.LimitRowWork(sqlrow.NewConditional(), 4)
				return s
			}},
		} {
			for _, shape := range []string{"catalog", "hot"} {
				b.Run(fmt.Sprintf("%s/%s/%s", engine, c.name, shape), func(b *testing.B) {
					ctx := context.Background()
					db := testdb.New(b, engine, 16)
					svc := sales.NewService(db, c.build(db), sales.WithOrderTimeout(30*time.Second))
					prefix := fmt.Sprintf("co-%d-", time.Now().UnixNano())
					req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, skus)}
					for i := range req.Sales {
						req.Sales[i] = inventory.SaleRequest{SKU: fmt.Sprintf("%s%05d", prefix, i), Available: stock}
					}
					if shape == "hot" {
						req.Sales = req.Sales[:1]
						req.Sales[0].Available = inventory.MaxInitialStock
					}
					if _, err := svc.OpenCatalog(ctx, req); err != nil {
						b.Fatal(err)
					}
					var next, created, failed atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					began := time.Now()
					for w := range buyers {
						wg.Go(func() {
							rng := rand.New(rand.NewPCG(uint64(w), 20261206))
							zipf := rand.NewZipf(rng, 1.3, 1, uint64(len(req.Sales)-1))
							for n := next.Add(1); n <= int64(b.N); n = next.Add(1) {
								sku := req.Sales[zipf.Uint64()].SKU
								_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprint("u", n)})
								switch {
								case err == nil:
									created.Add(1)
								case errors.Is(err, inventory.ErrSoldOut):
								default:
									if failed.Add(1) == 1 {
										b.Error(err)
									}
								}
							}
						})
					}
					wg.Wait()
					elapsed := time.Since(began)
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
					b.ReportMetric(float64(created.Load())/elapsed.Seconds(), "201/s")
				})
			}
		}
	}
}
