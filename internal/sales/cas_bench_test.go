package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// countingStore counts the transactions run through it.
type countingStore struct {
	inventory.Store
	txs *atomic.Int64
}

func (c countingStore) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	c.txs.Add(1)
	return c.Store.InTx(ctx, fn)
}

// BenchmarkCASBurst runs the burst of the three-instance end-to-end test in
// one process: three services, each with its own pool of 10 connections, on
// one database; 2,000 concurrent orders of one unit for 500. It compares
// version-cas without a bound on the attempts in flight and with the
// default bound of 2 (WithMaxInFlight quotes it). Each op is one burst;
// transactions/op is what the burst cost in compare-and-set transactions.
//
//	go test -run '^$' -bench CASBurst -benchtime 3x -count 3 ./internal/sales/
func BenchmarkCASBurst(b *testing.B) {
	const instances, conns, units, buyers = 3, 10, 500, 2000
	for _, engine := range store.Engines {
		for _, inFlight := range []int{0, 2} {
			b.Run(fmt.Sprintf("%s/in-flight=%d", engine, inFlight), func(b *testing.B) {
				ctx := context.Background()
				url := testdb.URL(b, engine)
				var txs atomic.Int64
				var services []*sales.Service
				var admin store.Store
				for i := range instances {
					st, err := store.Open(ctx, url, conns)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(st.Close)
					if i == 0 {
						if err := st.Migrate(ctx); err != nil {
							b.Fatal(err)
						}
						admin = st
					}
					cas := sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(inFlight))
					services = append(services, sales.NewService(countingStore{st, &txs}, cas,
						sales.WithOrderTimeout(30*time.Second)))
				}
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					if err := admin.StartSale(ctx, "burst", units); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					var sold atomic.Int64
					var wg sync.WaitGroup
					for i := range buyers {
						wg.Go(func() {
							_, err := services[i%instances].PlaceOrder(ctx, inventory.Request{SKU: "burst", Quantity: 1, UserID: fmt.Sprint("u-", i)})
							switch {
							case err == nil:
								sold.Add(1)
							case !errors.Is(err, inventory.ErrSoldOut):
								b.Error(err)
							}
						})
					}
					wg.Wait()
					if sold.Load() != units {
						b.Fatalf("sold %d of %d units", sold.Load(), units)
					}
				}
				b.ReportMetric(float64(txs.Load())/float64(b.N), "transactions/op")
			})
		}
	}
}
