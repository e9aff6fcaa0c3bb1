package reservation_test

import (
	"log/slog"
	"sync"
	"testing"

	"github.com/flashsale/stock/internal/reservation"
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

// TestReconcilerFindsDrift: a reconciliation audits every SKU on sale and
// reports the one whose accepted orders never reached the database. (That
// one instance runs it a period is the job scheduler's, internal/jobs.)
func TestReconcilerFindsDrift(t *testing.T) {
	s := newSale(t, "postgres")
	s.consume(droppingSink{}) // orders acknowledged, never written: drift
	s.start("healthy", 5)
	s.start("drifting", 5)
	if _, err := s.order("drifting", 2, "u", ""); err != nil {
		t.Fatal(err)
	}
	s.seen.waitFor(t, 1)

	got := &reconciled{}
	r := s.res.NewReconciler(reservation.NewReserved(s.res, s.db), slog.New(slog.DiscardHandler), got)
	if err := r.Reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	if got.runs != 1 || got.audited != 2 || got.drifting != 1 {
		t.Fatalf("reconciled %d SKUs, %d drifting in %d runs; want 2 and 1 in 1", got.audited, got.drifting, got.runs)
	}
}
