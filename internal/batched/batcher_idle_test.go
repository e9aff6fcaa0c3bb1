package batched

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// TestBatcherKeepsNothingForIdleSKUs: a SKU's queue leaves the batcher
// with its last order. 16 goroutines order every one of 10,000 SKUs twice,
// overlapping, so that some orders of a SKU wait behind another.
func TestBatcherKeepsNothingForIdleSKUs(t *testing.T) {
	b := newBatcher(256, 0, func(_ context.Context, batch []*batchOrder) []batchResult {
		results := make([]batchResult, len(batch))
		for i, o := range batch {
			results[i] = batchResult{order: o.order}
		}
		return results
	})
	const skus = 10_000
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < 2*skus; i = next.Add(1) - 1 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := b.submit(newBatchOrder(ctx, inventory.Order{SKU: fmt.Sprintf("sku-%d", i/2), Quantity: 1}, "", nil, 0))
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.queues); n != 0 {
		t.Errorf("the batcher keeps %d SKU queues once no order is queued or in flight, want 0", n)
	}
}
