package batched

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// expiresAfterOneLookCtx is an order's context whose deadline passes right
// after the first time anyone asks (a deadline that fires between lead's
// check under the lock and its filter of expired orders).
type expiresAfterOneLookCtx struct {
	context.Context
	looks atomic.Int32
}

func (c *expiresAfterOneLookCtx) Deadline() (time.Time, bool) { return time.Now(), true }
func (c *expiresAfterOneLookCtx) Err() error {
	if c.looks.Add(1) == 1 {
		return nil
	}
	return context.DeadlineExceeded
}

// TestBatcherDroppedLeaderHandsOn: the order told to lead, L, passes
// lead's check of its own deadline, then its deadline passes before the
// filter of expired orders. L is answered busy at once and hands the lead
// to F, whose goroutine runs the batch [F]. (The others' batch once ran on
// L's goroutine, so L's caller waited for F's whole transaction past its
// own deadline.)
func TestBatcherDroppedLeaderHandsOn(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	x := h.submit(context.Background(), "x", 1)
	wantBatch(t, g, "x")
	l := h.submit(&expiresAfterOneLookCtx{Context: context.Background()}, "L", 1)
	f := h.submit(context.WithValue(context.Background(), leaderKey{}, "F"), "F", 1)
	g.release <- struct{}{}
	wantOwnOrder(t, x)
	wantBatch(t, g, "F")
	// A batch runs under its leader's context values: F's means it runs
	// on F's goroutine, and L's caller does not wait for it.
	g.mu.Lock()
	leader := g.ctxs[1].Value(leaderKey{})
	g.mu.Unlock()
	if leader != "F" {
		t.Errorf("L's deadline has passed and it is out of the batch, yet the batch runs on its goroutine and its caller waits for the others' transaction")
		g.release <- struct{}{}
	}
	if r := <-l.answer; !errors.Is(r.err, inventory.ErrBusy) {
		t.Errorf("L: %v, want busy", r.err)
	}
	if leader == "F" {
		g.release <- struct{}{}
	}
	wantOwnOrder(t, f)
}

type leaderKey struct{}
