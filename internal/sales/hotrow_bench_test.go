package sales_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// BenchmarkHotRow: buyers concurrent goroutines place one-unit orders on one
// SKU through one service (a pool of 16 connections, no HTTP), with batched
// and with conditional as the service runs it (ROW_MAX_IN_FLIGHT=4). The
// stock never runs out. Each op is one order; orders/s is what the hot row
// took.
//
//	go test -run '^$' -bench HotRow -benchtime 2000x ./internal/sales/
func BenchmarkHotRow(b *testing.B) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameBatched, strategies.NameConditional} {
			for _, buyers := range []int{1, 16, 64, 256} {
				b.Run(fmt.Sprintf("%s/%s/buyers=%d", engine, name, buyers), func(b *testing.B) {
					ctx := context.Background()
					db := testdb.New(b, engine, 16)
					strategy, err := sqlrow.LimitRowWork(sqlrow.NewConditional(), 4)
					if err != nil {
						b.Fatal(err)
					}
					if name == strategies.NameBatched {
						strategy = batched.New(db).Strategy()
					}
					svc := sales.NewService(db, strategy, sales.WithOrderTimeout(30*time.Second))
					if err := svc.StartSale(ctx, "hot", inventory.MaxInitialStock); err != nil {
						b.Fatal(err)
					}
					burstOnHotRow(b, svc, buyers)
				})
			}
		}
	}
}

// burstOnHotRow has buyers goroutines place b.N one-unit orders on SKU
// "hot" through svc, each order a new user_id, and reports orders/s; any
// failed order fails the benchmark.
func burstOnHotRow(b *testing.B, svc *sales.Service, buyers int) {
	ctx := context.Background()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	began := time.Now()
	for range buyers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "hot", Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Errorf("%d of %d orders failed", n, b.N)
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
}
