package batched

import (
	"context"
	"errors"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// TestBatcherPanicAnswersBatchAndHandsOn: a batch whose run panics answers
// its orders unavailable and hands the lead on before the panic goes on up
// the leader's stack; the next batch of the SKU runs.
func TestBatcherPanicAnswersBatchAndHandsOn(t *testing.T) {
	g := newGatedRunner()
	run := func(ctx context.Context, batch []*batchOrder) []batchResult {
		if batch[0].order.ID == "A" {
			panic("injected")
		}
		return g.run(ctx, batch)
	}
	h := newHarness(t, 256, run)
	x := h.submit(context.Background(), "x", 1)
	wantBatch(t, g, "x")
	// A leads the next batch [A, B] on a goroutine that recovers.
	a := newBatchOrder(context.Background(), inventory.Order{ID: "A", SKU: "s", Quantity: 1}, "", nil, 0)
	recovered := make(chan any, 1)
	go func() {
		defer func() { recovered <- recover() }()
		_, _ = h.b.submit(a)
	}()
	<-h.queued
	b := h.submit(context.Background(), "B", 1)
	c := h.submit(context.Background(), "C", 1)
	g.release <- struct{}{}
	wantOwnOrder(t, x)
	if p := <-recovered; p != "injected" {
		t.Fatalf("A's goroutine recovered %v, want the batch's panic", p)
	}
	// B and C were in A's batch; C's position makes no difference.
	for _, s := range []submitted{b, c} {
		if r := <-s.answer; !errors.Is(r.err, inventory.ErrUnavailable) {
			t.Errorf("%s: %v, want unavailable", s.o.order.ID, r.err)
		}
	}
	d := h.submit(context.Background(), "D", 1)
	wantBatch(t, g, "D")
	g.release <- struct{}{}
	wantOwnOrder(t, d)
}
