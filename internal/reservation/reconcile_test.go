package reservation_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// reconciled records what a reconciler reported.
type reconciled struct {
	mu                sync.Mutex
	audited, drifting int
	runs              int
}

func (r *reconciled) Reconciled(audited, drifting int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.audited, r.drifting, r.runs = audited, drifting, r.runs+1
}

// blockingAuditor holds every audit until released.
type blockingAuditor struct {
	inner interface {
		Audit(context.Context, string) (inventory.Audit, error)
	}
	entered chan struct{}
	release chan struct{}
}

func (b *blockingAuditor) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.inner.Audit(ctx, sku)
}

// TestReconcilerFindsDriftOnOneInstanceAtATime: a reconciliation audits
// every SKU on sale and reports the one whose accepted orders never reached
// the database; while one instance reconciles, another's run is skipped.
func TestReconcilerFindsDriftOnOneInstanceAtATime(t *testing.T) {
	s := newSale(t, "postgres")
	s.consume(droppingSink{}) // orders acknowledged, never written: drift
	s.start("healthy", 5)
	s.start("drifting", 5)
	if _, err := s.order("drifting", 2, "u", ""); err != nil {
		t.Fatal(err)
	}
	s.seen.waitFor(t, 1)

	quiet := slog.New(slog.DiscardHandler)
	strategy := inventory.NewReserved(s.res, s.db)
	gate := &blockingAuditor{inner: strategy, entered: make(chan struct{}), release: make(chan struct{})}
	first := &reconciled{}
	a := s.res.NewReconciler(gate, time.Minute, quiet, first)
	b := s.res.NewReconciler(strategy, time.Minute, quiet, &reconciled{})

	ran := make(chan bool, 1)
	go func() { ran <- a.Once(context.Background()) }()
	<-gate.entered // a holds the lease, mid-run
	if b.Once(context.Background()) {
		t.Error("a second instance reconciled while the first held the lease")
	}
	close(gate.release)
	go func() {
		for range gate.entered { // the other SKU's audit
		}
	}()
	if !<-ran {
		t.Fatal("the first reconciliation did not run")
	}
	close(gate.entered)
	first.mu.Lock()
	defer first.mu.Unlock()
	if first.audited != 2 || first.drifting != 1 {
		t.Fatalf("reconciled %d SKUs, %d drifting; want 2 and 1", first.audited, first.drifting)
	}
	if !b.Once(context.Background()) {
		t.Error("the lease was not released after the run")
	}
}
