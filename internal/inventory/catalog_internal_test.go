package inventory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// catalogSKUs is how many distinct SKUs the catalog tests touch: each
// twice, by goroutines that overlap, so that some orders of a SKU wait
// behind another.
const catalogSKUs = 10_000

// touchCatalog calls touch for every SKU twice from 16 goroutines, and
// reports the errors on the test's goroutine.
func touchCatalog(t *testing.T, touch func(sku string) error) {
	t.Helper()
	var (
		next     atomic.Int64
		mu       sync.Mutex
		failures []error
		wg       sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= 2*catalogSKUs {
					return
				}
				if err := touch(fmt.Sprintf("sku-%d", i/2)); err != nil {
					mu.Lock()
					if len(failures) < 10 {
						failures = append(failures, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, err := range failures {
		t.Error(err)
	}
}

// TestRowGateKeepsNothingForIdleSKUs: the row gate's semaphores exist only
// while an order of their SKU holds or waits for a place, including an
// order that gives up waiting.
func TestRowGateKeepsNothingForIdleSKUs(t *testing.T) {
	g := newKeyedGate(1)
	touchCatalog(t, func(sku string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		leave, err := g.enter(ctx, sku)
		if err != nil {
			return err
		}
		leave()
		return nil
	})
	leave, err := g.enter(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}
	gaveUp, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.enter(gaveUp, "held"); err == nil {
		t.Fatal("entered a full gate")
	}
	leave()
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := len(g.slots); n != 0 {
		t.Errorf("the gate keeps %d semaphores once no order holds or waits, want 0", n)
	}
}

// TestBatcherKeepsNothingForIdleSKUs: a SKU's queue leaves the batcher
// with its last order.
func TestBatcherKeepsNothingForIdleSKUs(t *testing.T) {
	b := newBatcher(256, 0, func(_ context.Context, batch []*batchOrder) []batchResult {
		results := make([]batchResult, len(batch))
		for i, o := range batch {
			results[i] = batchResult{order: o.order}
		}
		return results
	})
	touchCatalog(t, func(sku string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := b.submit(newBatchOrder(ctx, Order{SKU: sku, Quantity: 1}, "", nil))
		return err
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.queues); n != 0 {
		t.Errorf("the batcher keeps %d SKU queues once no order is queued or in flight, want 0", n)
	}
}
