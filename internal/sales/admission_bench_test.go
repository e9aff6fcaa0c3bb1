package sales_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/semaphore"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// BenchmarkAdmission: three instances of the service (each its own pool of
// 16 connections and its row gate, ROW_MAX_IN_FLIGHT=4, as the service
// runs them) take one-unit orders on one SKU from 96 buyers, for
// conditional and for-update, without ADMISSION_LIMIT and with it at 1, 2,
// 4 and 8 places across the three. The stock never runs out. Reported:
// orders/s and the p99 of an order's latency (ms).
//
//	go test -run '^$' -bench Admission -benchtime 3000x ./internal/sales/
func BenchmarkAdmission(b *testing.B) {
	const instances, buyers = 3, 96
	srv := testredis.Start(b)
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameForUpdate} {
			for _, limit := range []int{0, 1, 2, 4, 8} {
				label := "off"
				if limit > 0 {
					label = fmt.Sprint(limit)
				}
				b.Run(fmt.Sprintf("%s/%s/admission=%s", engine, name, label), func(b *testing.B) {
					ctx := context.Background()
					url := testdb.MigratedURL(b, engine)
					svcs := make([]*sales.Service, instances)
					for i := range svcs {
						db, err := store.Open(ctx, url, 16)
						if err != nil {
							b.Fatal(err)
						}
						b.Cleanup(db.Close)
						var s inventory.Strategic = sqlrow.NewConditional()
						if name == strategies.NameForUpdate {
							s = sqlrow.NewForUpdate()
						}
						if limit > 0 {
							sem, err := semaphore.New(srv.Client(b), limit, semaphore.WithPrefix(fmt.Sprintf("sem-%s-%s-%d:", engine, name, limit)))
							if err != nil {
								b.Fatal(err)
							}
							b.Cleanup(func() { _ = sem.Close() })
							if s, err = sqlrow.AdmitThrough(s, inventorylock.Admission(sem)); err != nil {
								b.Fatal(err)
							}
						}
						gated, err := sqlrow.LimitRowWork(s, 4)
						if err != nil {
							b.Fatal(err)
						}
						svcs[i] = sales.NewService(db, gated, sales.WithOrderTimeout(30*time.Second))
					}
					if err := svcs[0].StartSale(ctx, "hot", inventory.MaxInitialStock); err != nil {
						b.Fatal(err)
					}
					var next, failed atomic.Int64
					latencies := make([][]time.Duration, buyers)
					var wg sync.WaitGroup
					b.ResetTimer()
					began := time.Now()
					for g := range buyers {
						wg.Go(func() {
							svc := svcs[g%instances]
							for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
								t0 := time.Now()
								_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "hot", Quantity: 1, UserID: fmt.Sprint("u-", i)})
								latencies[g] = append(latencies[g], time.Since(t0))
								if err != nil {
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
					all := slices.Concat(latencies...)
					slices.Sort(all)
					b.ReportMetric(float64(b.N)/elapsed.Seconds(), "orders/s")
					if len(all) > 0 {
						b.ReportMetric(float64(all[len(all)*99/100])/float64(time.Millisecond), "p99-ms")
					}
				})
			}
		}
	}
}
