package sales_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// resetFailsOnce is a row strategy with a lock strategy's resets, the
// first of which fails after the start's transaction committed (a Redis
// restarted between SCRIPT LOAD and the pipeline, an etcd transaction cut
// by the deadline).
type resetFailsOnce struct {
	inner  inventory.Strategic
	resets atomic.Int32
	failed atomic.Bool
}

func (f *resetFailsOnce) reset() error {
	f.resets.Add(1)
	if f.failed.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: the lock service did not answer (test)", inventory.ErrUnavailable)
	}
	return nil
}

func (f *resetFailsOnce) Strategy() inventory.Strategy {
	s := f.inner.Strategy()
	s.ResetSKU = func(context.Context, string) error { return f.reset() }
	s.ResetSKUs = func(context.Context, []string) error { return f.reset() }
	return s
}

// TestStartRetryRedoesTheLockReset: a start whose lock reset failed after
// its commit answers 503 and asks for a retry with the same
// Idempotency-Key; the retry finds the key and must reset the locks
// again, for a catalog and for one SKU, before it answers 200 replayed
// (found by review: it answered 200 with the old sales' locks left).
func TestStartRetryRedoesTheLockReset(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 4)

			catalog := &resetFailsOnce{inner: sqlrow.NewConditional()}
			svc := sales.NewService(db, catalog)
			req := inventory.CatalogRequest{IdempotencyKey: "catalog-reset", Sales: []inventory.SaleRequest{{SKU: "r-a", Available: 5}, {SKU: "r-b", Available: 5}}}
			if _, err := svc.OpenCatalog(ctx, req); err == nil {
				t.Fatal("the catalog whose reset failed: answered 200; want the reset's 503")
			}
			if got, err := svc.OpenCatalog(ctx, req); err != nil || !got.Replayed || catalog.resets.Load() != 2 {
				t.Errorf("the catalog's retry: %+v, %v, after %d resets; want replayed after a second reset", got, err, catalog.resets.Load())
			}

			one := &resetFailsOnce{inner: sqlrow.NewConditional()}
			svc = sales.NewService(db, one)
			sale := inventory.SaleRequest{SKU: "r-c", Available: 5, IdempotencyKey: "start-reset"}
			if _, err := svc.OpenSale(ctx, sale); err == nil {
				t.Fatal("the start whose reset failed: answered 200; want the reset's 503")
			}
			if got, err := svc.OpenSale(ctx, sale); err != nil || !got.Replayed || one.resets.Load() != 2 {
				t.Errorf("the start's retry: %+v, %v, after %d resets; want replayed after a second reset", got, err, one.resets.Load())
			}
		})
	}
}
