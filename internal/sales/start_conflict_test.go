package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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

func (d *deadlockingStarts) StartCatalogWith(ctx context.Context, c inventory.CatalogStart) ([]int64, error) {
	if d.victims.Add(-1) < 0 {
		return d.Store.StartCatalogWith(ctx, c)
	}
	before := c.BeforeCommit
	c.BeforeCommit = func(ctx context.Context, sales []int64) error {
		if before != nil {
			if err := before(ctx, sales); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: deadlock detected (SQLSTATE 40P01) (test)", inventory.ErrConflict)
	}
	return d.Store.StartCatalogWith(ctx, c)
}

// InTx makes the next transactions victims too, once their work is done:
// a restock's, a pay's, a cancel's.
func (d *deadlockingStarts) InTx(ctx context.Context, fn func(ctx context.Context, tx inventory.Tx) error) error {
	return d.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if d.victims.Add(-1) >= 0 {
			return fmt.Errorf("%w: deadlock detected (SQLSTATE 40P01) (test)", inventory.ErrConflict)
		}
		return nil
	})
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
				catalog := inventory.CatalogRequest{Sales: []inventory.SaleRequest{{SKU: "victim-a", Available: 2}, {SKU: "victim-b", Available: 2}}}
				if _, err := svc.OpenCatalog(ctx, catalog); !errors.Is(err, inventory.ErrBusy) {
					t.Errorf("a catalog start that keeps losing: %v, want busy", err)
				}
				db.victims.Store(2)
				if _, err := svc.OpenCatalog(ctx, catalog); err != nil {
					t.Fatalf("a catalog start chosen twice as a deadlock's victim: %v, want it retried", err)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "victim-b", Quantity: 2, UserID: "u"}); err != nil {
					t.Fatalf("an order of the catalog's sale: %v", err)
				}
				db.victims.Store(0)
			})
		}
	}
}

// TestRestockPayAndCancelChosenAsDeadlockVictimsAreRetried: a restock, a
// pay and a cancel that the database rolls back to resolve a deadlock run
// again and land once (the restock adds its units once); one that keeps
// losing is busy (a 503) and changes nothing, never an error the API does
// not know.
func TestRestockPayAndCancelChosenAsDeadlockVictimsAreRetried(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameBatched, strategies.NameRedisReserve} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := &deadlockingStarts{Store: testdb.New(t, engine, 8)}
				svc := sales.NewService(db, builders()[name](t, engine, db), sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(20*time.Second))
				ctx := context.Background()
				if err := svc.StartSale(ctx, "settle", 10); err != nil {
					t.Fatal(err)
				}
				var held []inventory.Order
				for i := range 2 {
					o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "settle", Quantity: 1, UserID: fmt.Sprint("u", i)})
					if err != nil {
						t.Fatalf("order: %v", err)
					}
					held = append(held, o)
				}
				quietAudit(t, svc, "settle")

				db.victims.Store(2)
				if _, err := svc.Restock(ctx, "settle", 5); err != nil {
					t.Errorf("a restock chosen twice as a deadlock's victim: %v, want it retried", err)
				}
				db.victims.Store(2)
				if _, err := svc.PayOrder(ctx, held[0].ID, held[0].UserID); err != nil {
					t.Errorf("a pay chosen twice as a deadlock's victim: %v, want it retried", err)
				}
				db.victims.Store(2)
				if _, err := svc.CancelOrder(ctx, held[1].ID, held[1].UserID); err != nil {
					t.Errorf("a cancel chosen twice as a deadlock's victim: %v, want it retried", err)
				}
				db.victims.Store(1000)
				if _, err := svc.Restock(ctx, "settle", 7); !errors.Is(err, inventory.ErrBusy) {
					t.Errorf("a restock that keeps losing: %v, want busy", err)
				}
				db.victims.Store(0)
				a, err := db.Store.Audit(ctx, "settle")
				if err != nil {
					t.Fatal(err)
				}
				if a.Restocked != 5 || a.Paid != 1 || a.Cancelled != 1 || len(a.Restocks) != 1 {
					t.Errorf("audit %+v: want one restock of 5, one order paid, one cancelled", a)
				}
			})
		}
	}
}
