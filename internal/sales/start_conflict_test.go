package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// deadlockingStarts is a database whose next starts are chosen as a
// deadlock's victim after their work (the reservation store's close
// included), as PostgreSQL chose a sale's start racing the old sale's
// expiries and cancels under load: rolled back, SQLSTATE 40P01.
type deadlockingStarts struct {
	store.Store
	victims atomic.Int32
}

func (d *deadlockingStarts) StartSaleWith(ctx context.Context, st inventory.SaleStart) (int64, error) {
	if d.victims.Add(-1) < 0 {
		return d.Store.StartSaleWith(ctx, st)
	}
	before := st.BeforeCommit
	st.BeforeCommit = func(ctx context.Context, sale int64) error {
		if before != nil {
			if err := before(ctx, sale); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: deadlock detected (SQLSTATE 40P01) (test)", inventory.ErrConflict)
	}
	return d.Store.StartSaleWith(ctx, st)
}

// TestSaleStartChosenAsADeadlockVictimIsRetried: a start the database
// rolls back to resolve a deadlock runs again, on every strategy (the
// reservation strategies' starts went straight to the client as the bare
// conflict, a 500); one that keeps losing is busy (a 503), never an error
// the API does not know.
func TestSaleStartChosenAsADeadlockVictimIsRetried(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameBatched, strategies.NameRedisReserve, strategies.NameRedisWatch} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := &deadlockingStarts{Store: testdb.New(t, engine, 8)}
				svc := sales.NewService(db, builders()[name](t, engine, db))
				ctx := context.Background()
				db.victims.Store(2)
				if err := svc.StartSale(ctx, "victim", 3); err != nil {
					t.Fatalf("a start chosen twice as a deadlock's victim: %v, want it retried", err)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "victim", Quantity: 3, UserID: "u"}); err != nil {
					t.Fatalf("an order of the started sale: %v", err)
				}
				db.victims.Store(1000)
				err := svc.StartSale(ctx, "victim", 3)
				if !errors.Is(err, inventory.ErrBusy) {
					t.Errorf("a start that keeps losing: %v, want busy", err)
				}
				db.victims.Store(0)
			})
		}
	}
}
