package batched

import (
	"context"
	"sync"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// submitSKU submits a one-unit order of sku through h.
func (h *harness) submitSKU(ctx context.Context, id, sku string) submitted {
	h.t.Helper()
	return h.submitOrder(newBatchOrder(ctx, inventory.Order{ID: id, SKU: sku, Quantity: 1}, "", nil, 0))
}

// newHeldHarness is a harness of one lane for every SKU whose lane
// batches find the row of SKU "a" held (errRowHeld), with a gated runner
// for the lane's batches and one for the held queues'.
func newHeldHarness(t *testing.T) (h *harness, lane, held *gatedRunner) {
	lane, held = newGatedRunner(), newGatedRunner()
	h = newHarness(t, 256, func(ctx context.Context, batch []*batchOrder) []batchResult {
		results := lane.run(ctx, batch)
		for i, o := range batch {
			if o.sku == "a" {
				results[i] = batchResult{err: errRowHeld}
			}
		}
		return results
	})
	h.b.runHeld = held.run
	h.b.laneOf = lanes(1)
	return h, lane, held
}

// TestBatcherMovesAHeldSKUsOrdersToItsOwnQueueInArrivalOrder: one lane
// for every SKU. a1's lane batch finds a's row held (errRowHeld) while
// b1, a2 and b2 queue in the lane. a1 moves to a queue of a alone, and a2,
// queued in the lane behind it, moves with it: a's batch is a1 then a2,
// and the lane's next batch is b1 and b2 only. a3, which comes while a's
// batch runs, joins a's queue, not the lane. Every order gets its own
// answer, and nothing is left queued.
func TestBatcherMovesAHeldSKUsOrdersToItsOwnQueueInArrivalOrder(t *testing.T) {
	h, lane, held := newHeldHarness(t)
	ctx := context.Background()

	a1 := h.submitSKU(ctx, "a1", "a")
	wantBatch(t, lane, "a1")
	b1, a2, b2 := h.submitSKU(ctx, "b1", "b"), h.submitSKU(ctx, "a2", "a"), h.submitSKU(ctx, "b2", "b")
	lane.release <- struct{}{}
	wantBatch(t, held, "a1", "a2")
	wantBatch(t, lane, "b1", "b2")

	a3 := h.submitSKU(ctx, "a3", "a")
	lane.release <- struct{}{}
	wantOwnOrder(t, b1)
	wantOwnOrder(t, b2)
	held.release <- struct{}{}
	wantOwnOrder(t, a1)
	wantOwnOrder(t, a2)
	wantBatch(t, held, "a3")
	held.release <- struct{}{}
	wantOwnOrder(t, a3)

	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if len(h.b.queues) != 0 || len(h.b.held) != 0 {
		t.Errorf("an idle batcher keeps %d lanes and %d held SKUs' queues", len(h.b.queues), len(h.b.held))
	}
}

// TestBatcherHeldQueueLeaderMayBeTheLanesLeader: the lane's leader's own
// order is the one whose row is held: it moves to its SKU's queue and
// leads it once the lane's batch is answered and handed on, so neither
// queue waits for the other.
func TestBatcherHeldQueueLeaderMayBeTheLanesLeader(t *testing.T) {
	h, lane, held := newHeldHarness(t)
	ctx := context.Background()

	b0 := h.submitSKU(ctx, "b0", "b")
	wantBatch(t, lane, "b0")
	a1, b1 := h.submitSKU(ctx, "a1", "a"), h.submitSKU(ctx, "b1", "b")
	lane.release <- struct{}{}
	wantOwnOrder(t, b0)
	wantBatch(t, lane, "a1", "b1") // led by a1's goroutine
	lane.release <- struct{}{}
	wantOwnOrder(t, b1)
	wantBatch(t, held, "a1")
	held.release <- struct{}{}
	wantOwnOrder(t, a1)
}

// On a Galera cluster a batch's transaction goes through the node of its
// affinity (inventory.WithAffinity). A held SKU's batch must go through its
// lane's node: there the lane's batch that holds the row is, and the held
// batch waits for it; through another node it took the row at once, and
// its commit failed the lane's whole batch at certification (found by
// review). So both carry the lane's name, not the SKU the order carried.
func TestAHeldSKUsBatchesGoWhereItsLanesBatchesGo(t *testing.T) {
	h, lane, held := newHeldHarness(t)
	var (
		mu   sync.Mutex
		seen = map[string][]string{}
	)
	record := func(runner string, run batchRunner) batchRunner {
		return func(ctx context.Context, batch []*batchOrder) []batchResult {
			key, _ := inventory.AffinityOf(ctx)
			mu.Lock()
			seen[runner] = append(seen[runner], key)
			mu.Unlock()
			return run(ctx, batch)
		}
	}
	h.b.run, h.b.runHeld = record("lane", h.b.run), record("held", h.b.runHeld)
	// The order carries its SKU's affinity, as the service gives it.
	a1 := h.submitSKU(inventory.WithAffinity(context.Background(), "a"), "a1", "a")
	wantBatch(t, lane, "a1")
	lane.release <- struct{}{}
	wantBatch(t, held, "a1")
	held.release <- struct{}{}
	wantOwnOrder(t, a1)
	mu.Lock()
	defer mu.Unlock()
	want := h.b.laneOf("a")
	for _, runner := range []string{"lane", "held"} {
		if len(seen[runner]) != 1 || seen[runner][0] != want {
			t.Errorf("the %s batch ran with the affinities %q, want [%q]", runner, seen[runner], want)
		}
	}
}
