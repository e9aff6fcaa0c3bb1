package sales_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
)

// lateBatchCommit is lateCommit for batched's own transactions: its armed
// batch reports its commit answer lost while the COMMIT has not landed
// yet, and commits when released.
type lateBatchCommit struct {
	store.Store
	armed   atomic.Bool
	held    chan int64
	release chan struct{}
	done    chan error
}

func (s *lateBatchCommit) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.InBatchTx(ctx, fn)
	}
	return holdCommit(ctx, s.Store.InBatchTx, fn, s.held, s.release, s.done)
}

// TestBatchedOrderWhoseCommitLandsAfterItsAnswerWasLostIsFound: batched's
// lookup of a lost commit answer waits for the SKU's row, as the service's
// does: a batch whose COMMIT lands after its answer was lost is found, and
// its buyers get their 201s (a plain read found nothing, and every buyer
// of the batch was told 503).
func TestBatchedOrderWhoseCommitLandsAfterItsAnswerWasLostIsFound(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, raw := dbWithRawAccess(t, engine, 8)
			late := &lateBatchCommit{Store: db, held: make(chan int64, 1), release: make(chan struct{}), done: make(chan error, 1)}
			svc := sales.NewService(db, batched.New(late), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "late-batch", 3); err != nil {
				t.Fatal(err)
			}
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(late.release) }) }
			t.Cleanup(release)
			late.armed.Store(true)
			placed := make(chan result, 1)
			answered := make(chan struct{})
			go func() {
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "late-batch", Quantity: 1, UserID: "u-late"})
				placed <- result{order: o, err: err}
				close(answered)
			}()
			holder := <-late.held
			if !raw.waitBlockedByOr(t, holder, 1, answered) {
				r := <-placed
				t.Fatalf("the buyer was answered (%+v, %v) before the batch's commit landed", r.order, r.err)
			}
			release()
			if err := <-late.done; err != nil {
				t.Fatalf("the late commit: %v", err)
			}
			r := <-placed
			a := checkAudit(t, svc, "late-batch", 3)
			if a.Orders != 1 || r.err != nil || r.order.ID == "" {
				t.Errorf("the batch committed (%d orders), yet its buyer was told %v", a.Orders, r.err)
			}
		})
	}
}
