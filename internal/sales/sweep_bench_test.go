package sales_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// BenchmarkSweep: what the sweep (ExpireHolds) costs a lapsed hold, with
// the holds all on one SKU and with each on a SKU of its own in a catalog
// of 10,000, for conditional and for redis-reserve (whose returns go on to
// Redis), on both engines. Each op is one lapsed hold expired and its unit
// given back; only the sweep is timed. Compare ms/1000 holds of the two
// shapes in one run: the cost should follow the holds, not the SKUs they
// are spread over.
//
//	go test -run '^$' -bench Sweep -benchtime 2000x ./internal/sales/
func BenchmarkSweep(b *testing.B) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameRedisReserve} {
			for _, shape := range []string{"one-sku", "catalog"} {
				b.Run(fmt.Sprintf("%s/%s/%s", engine, name, shape), func(b *testing.B) {
					ctx := context.Background()
					e, _ := strategies.Lookup(name)
					db := testdb.New(b, engine, 16)
					svc := sales.NewService(db, fromRegistry(b, engine, db, e),
						sales.WithOrderTimeout(30*time.Second), sales.WithHoldTTL(time.Millisecond))
					skus := make([]string, 1)
					if shape == "catalog" {
						skus = make([]string, inventory.MaxCatalogSKUs)
					}
					req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, len(skus))}
					for i := range skus {
						skus[i] = fmt.Sprintf("sweep-%05d", i)
						req.Sales[i] = inventory.SaleRequest{SKU: skus[i], Available: int64(b.N/len(skus) + 1)}
					}
					if _, err := svc.OpenCatalog(ctx, req); err != nil {
						b.Fatal(err)
					}
					placed := placeHolds(b, svc, skus, b.N)
					awaitWritten(b, svc, placed)
					b.ResetTimer()
					expired := 0
					for expired < b.N {
						n, err := svc.ExpireHolds(ctx, sales.DefaultSweepBatch)
						if err != nil {
							b.Fatal(err)
						}
						if n == 0 {
							b.Fatalf("the sweep found no lapsed hold with %d of %d expired", expired, b.N)
						}
						expired += n
					}
					b.StopTimer()
					b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/hold")
					for _, sku := range placed {
						a, err := svc.Audit(ctx, sku)
						if err != nil {
							b.Fatal(err)
						}
						if a.Held != 0 {
							b.Fatalf("%s: %d units still held after the sweep", sku, a.Held)
						}
					}
				})
			}
		}
	}
}

// placeHolds places n one-unit orders, held, round robin over skus, 32 at
// a time, and returns the SKUs it held units of.
func placeHolds(b *testing.B, svc *sales.Service, skus []string, n int) []string {
	b.Helper()
	ctx := context.Background()
	errs := make(chan error, n)
	gate := make(chan struct{}, 32)
	for i := range n {
		gate <- struct{}{}
		go func() {
			defer func() { <-gate }()
			_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: skus[i%len(skus)], Quantity: 1, UserID: fmt.Sprint("sweeper-", i)})
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	return skus[:min(n, len(skus))]
}

// awaitWritten waits (30 s at most) until every order of the SKUs is a row
// in the database (the reservation strategies answer before their stream
// writes it) and every hold has lapsed by the database's clock.
func awaitWritten(b *testing.B, svc *sales.Service, skus []string) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, sku := range skus {
		for {
			a, err := svc.Audit(context.Background(), sku)
			if err == nil && a.Pending == 0 && (a.Written == nil || a.Written.Orders == a.Orders) {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: orders still not written after 30 s: %+v, %v", sku, a, err)
			}
			time.Sleep(5 * time.Millisecond) // polling the stream's progress
		}
	}
	time.Sleep(10 * time.Millisecond) // the holds of 1 ms lapse: expiry is what is measured
}
