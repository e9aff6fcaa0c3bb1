package reservation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/flashsale/stock/internal/inventory"
)

// Auditor is what the reconciler needs from the domain: the audit of a SKU
// that compares Redis's tally, the stream and the database
// (inventory.Reserved).
type Auditor interface {
	Audit(ctx context.Context, sku string) (inventory.Audit, error)
}

// ReconcileObserver hears each reconciliation, for metrics.
type ReconcileObserver interface {
	// Reconciled reports a run: how many SKUs were audited and how many
	// drift (their database disagrees with Redis, or Redis does not add
	// up).
	Reconciled(audited, drifting int)
}

// Reconciler audits every SKU on sale and reports the SKUs whose Redis and
// database disagree: a log line each and the observer's figures. It runs
// as a job of the service's scheduler (internal/jobs), which runs it on one
// instance a period under the job lock of the lock table.
type Reconciler struct {
	store *Store
	audit Auditor
	log   *slog.Logger
	obs   ReconcileObserver
}

// NewReconciler returns a reconciler of s's SKUs through audit.
func (s *Store) NewReconciler(audit Auditor, log *slog.Logger, obs ReconcileObserver) *Reconciler {
	return &Reconciler{store: s, audit: audit, log: log, obs: obs}
}

// Reconcile runs one reconciliation, within ctx (the job's "at most").
func (r *Reconciler) Reconcile(ctx context.Context) error {
	skus, err := r.store.rdb.SMembers(ctx, r.store.skusKey()).Result()
	if err != nil {
		return fmt.Errorf("reconciler: cannot list the SKUs on sale: %w", err)
	}
	audited, drifting := 0, 0
	for _, sku := range skus {
		a, err := r.audit.Audit(ctx, sku)
		switch {
		case errors.Is(err, inventory.ErrUnknownSKU), errors.Is(err, inventory.ErrSaleNotLoaded):
			continue // no sale, or closed: nothing to compare
		case err != nil:
			r.log.Warn("reconciler: audit failed", "sku", sku, "err", err)
			continue
		}
		audited++
		if !a.Consistent() {
			drifting++
			r.log.Error("reconciler: Redis and the database disagree", "sku", sku, "drift", a.Drift,
				"initial", a.Initial, "available", a.Available, "ordered", a.Ordered, "orders", a.Orders, "pending", a.Pending)
		}
	}
	r.obs.Reconciled(audited, drifting)
	return nil
}
