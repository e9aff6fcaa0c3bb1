package sales_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// signallingStore counts the transactions begun through it and signals each: the real store,
// instrumented.
type signallingStore struct {
	inventory.Store
	began atomic.Int64
	first chan struct{} // one send per transaction begun, never blocking
}

func (c *signallingStore) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	c.began.Add(1)
	select {
	case c.first <- struct{}{}:
	default:
	}
	return c.Store.InTx(ctx, fn)
}

// TestRowGateKeepsOtherSKUsServed: a flood of orders on SKU A, whose row is
// held by an open transaction, cannot starve an order on SKU B. With a gate
// of 2 per SKU and a pool of 4 (the holder, 2 orders on A, and one spare),
// 12 orders on A leave a connection free and B's order completes while they
// wait; without the gate they take the whole pool and B waits out its
// deadline behind them. When the holder lets go, every order on A goes
// through.
func TestRowGateKeepsOtherSKUsServed(t *testing.T) {
	const gate, flood = 2, 12
	rowStrategies := map[string]func() inventory.Strategic{
		strategies.NameForUpdate:   func() inventory.Strategic { return sqlrow.NewForUpdate() },
		strategies.NameConditional: func() inventory.Strategic { return sqlrow.NewConditional() },
		strategies.NameNaive:       func() inventory.Strategic { return sqlrow.NewNaive() },
	}
	for _, engine := range store.Engines {
		for name, build := range rowStrategies {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := &signallingStore{Store: testdb.New(t, engine, gate+2), first: make(chan struct{}, flood+1)}
				gated, err := sqlrow.LimitRowWork(build(), gate)
				if err != nil {
					t.Fatal(err)
				}
				svc := sales.NewService(db, gated, sales.WithOrderTimeout(5*time.Second))
				for sku, n := range map[string]int64{"a": 100, "b": 10} {
					if err := svc.StartSale(ctx, sku, n); err != nil {
						t.Fatal(err)
					}
				}

				release := testdb.HoldRow(t, db.Store, "a")

				results := make(chan error, flood)
				for i := range flood {
					go func() {
						_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "a", Quantity: 1, UserID: fmt.Sprint("a-", i)})
						results <- err
					}()
				}
				// The gate's worth of orders on A are in their transactions.
				for range gate {
					<-db.first
				}

				began := time.Now()
				_, errB := svc.PlaceOrder(ctx, inventory.Request{SKU: "b", Quantity: 1, UserID: "b"})
				tookB := time.Since(began)
				inA := db.began.Load() - 1 // B's own transaction
				if err := release(); err != nil {
					t.Error(err)
				}
				if errB != nil {
					t.Errorf("the order on b, behind a flood on a: %v after %v, want it served", errB, tookB.Round(time.Millisecond))
				}
				if inA > gate {
					t.Errorf("%d orders on a began a transaction while its row was held, want at most %d", inA, gate)
				}
				t.Logf("the order on b took %v with %d orders on a in a transaction", tookB.Round(time.Millisecond), inA)

				var failed int
				for range flood {
					if err := <-results; err != nil {
						failed++
						t.Errorf("an order on a: %v", err)
					}
				}
				a, err := svc.Audit(ctx, "a")
				if err != nil {
					t.Fatal(err)
				}
				if a.Orders != int64(flood-failed) || !a.Consistent() {
					t.Errorf("audit of a %+v, want %d orders", a, flood-failed)
				}
			})
		}
	}
}
