package reservation_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// BenchmarkDrain: how fast consumers write orders waiting in Redis to the
// database, 2,000 one-unit orders an iteration, as a catalog (2,000 SKUs,
// an order each) and as one hot SKU (2,000 orders), side by side on each
// engine; one consumer, and three (as three instances run them: their
// transactions share the catalog's rows, taken in one order). The orders
// are taken with the consumers stopped; the clock runs from their start to
// the commit of the last order. written/s is the drain's rate.
//
//	go test -run '^$' -bench Drain -benchtime 5x -count 3 ./internal/reservation/
func BenchmarkDrain(b *testing.B) {
	for _, engine := range []string{"postgres", "mysql"} {
		for _, shape := range []struct {
			name string
			skus int
		}{{"catalog", 2000}, {"hot", 1}} {
			for _, consumers := range []int{1, 3} {
				b.Run(fmt.Sprintf("%s/%s/consumers=%d", engine, shape.name, consumers), func(b *testing.B) {
					benchDrain(b, engine, shape.skus, 2000, consumers)
				})
			}
		}
	}
}

func benchDrain(b *testing.B, engine string, skus, orders, consumers int) {
	ctx := context.Background()
	db := testdb.New(b, engine, 16)
	rdb := redis.NewClient(&redis.Options{Addr: testredis.StartDurable(b).Addr, MaxRetries: -1, PoolSize: 64})
	b.Cleanup(func() { _ = rdb.Close() })
	res := reservation.New(rdb, db)
	svc := sales.NewService(db, reservation.NewReserved(res, db), sales.WithOrderTimeout(30*time.Second))
	var total time.Duration
	for iter := range b.N {
		b.StopTimer()
		req := inventory.CatalogRequest{Sales: make([]inventory.SaleRequest, skus)}
		for i := range req.Sales {
			req.Sales[i] = inventory.SaleRequest{SKU: fmt.Sprintf("d%d-%05d", iter, i), Available: int64(orders)}
		}
		if _, err := svc.OpenCatalog(ctx, req); err != nil {
			b.Fatal(err)
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(orders); i = next.Add(1) - 1 {
					sku := req.Sales[i%int64(skus)].SKU
					if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		seen := &lags{}
		runCtx, cancel := context.WithCancel(ctx)
		var running sync.WaitGroup
		b.StartTimer()
		began := time.Now()
		for range consumers {
			consumer := res.NewConsumer(db, reservation.WithConsumerObserver(seen))
			running.Go(func() { _ = consumer.Run(runCtx) })
		}
		seen.waitFor(b, int64(orders))
		total += time.Since(began)
		b.StopTimer()
		cancel()
		running.Wait()
	}
	b.ReportMetric(float64(b.N*orders)/total.Seconds(), "written/s")
}
