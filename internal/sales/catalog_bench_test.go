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

// BenchmarkCatalogStart puts a catalog of 10,000 SKUs on sale in one
// request (PUT /admin/stock's OpenCatalog), again and again, so every
// start after the first restarts sales, on every strategy (the row
// strategies start in the database alone, the lock strategies reset their
// lock keys too, the reservation strategies close and load Redis in
// pipelines), on both engines. The goal: at most 1 s on PostgreSQL.
func BenchmarkCatalogStart(b *testing.B) {
	const skus = inventory.MaxCatalogSKUs
	req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, skus)}
	for i := range req.Sales {
		req.Sales[i] = inventory.SaleRequest{SKU: fmt.Sprintf("bench-%05d", i), Available: 20}
	}
	for _, engine := range store.Engines {
		for _, e := range strategies.All() {
			b.Run(engine+"/"+e.Name, func(b *testing.B) {
				db := testdb.New(b, engine, 8)
				svc := sales.NewService(db, fromRegistry(b, engine, db, e), sales.WithOrderTimeout(30*time.Second))
				ctx := context.Background()
				b.ResetTimer()
				for b.Loop() {
					if _, err := svc.OpenCatalog(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/catalog")
			})
		}
	}
}
