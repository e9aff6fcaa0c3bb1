package reservation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// Auditor is what the reconciler needs from the domain: the audit of a SKU
// that compares Redis's tally, the stream and the database
// (Reserved).
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

// Reconciler audits the SKUs on sale, a page of the catalog per run, and
// reports the SKUs whose Redis and database disagree: a log line each and
// the observer's figures. It runs as a job of the service's scheduler
// (internal/jobs), which runs it on one instance a period under the job
// lock of the lock table. Where the page ended is kept in Redis, so the
// next run, on whichever instance, goes on from there: a run's cost is its
// page, not the catalog, and every SKU is audited once every
// catalog/page runs.
type Reconciler struct {
	store *Store
	audit Auditor
	log   *slog.Logger
	obs   ReconcileObserver
	page  int64
}

// ReconcilePage is about how many SKUs one reconciliation audits (ZSCAN's
// COUNT, a hint): with 10,000 SKUs on sale and a run every 30 s, each is
// audited every 5 minutes.
const ReconcilePage = 1000

// NewReconciler returns a reconciler of s's SKUs through audit.
func (s *Store) NewReconciler(audit Auditor, log *slog.Logger, obs ReconcileObserver) *Reconciler {
	return &Reconciler{store: s, audit: audit, log: log, obs: obs, page: ReconcilePage}
}

// reconcileNextKey holds the catalog's ZSCAN cursor the next
// reconciliation starts at (0: a new walk).
func (s *Store) reconcileNextKey() string { return s.prefix + "reserve:reconcile:next" }

// Reconcile runs one reconciliation, within ctx (the job's "at most").
func (r *Reconciler) Reconcile(ctx context.Context) error {
	rdb := r.store.rdb
	// A ZSCAN cursor, not an index: a walk reads every SKU listed for the
	// whole walk, whatever joins or leaves the catalog meanwhile (an index
	// skipped one SKU for each that left before it; see Consumer.sweep).
	start, err := rdb.Get(ctx, r.store.reconcileNextKey()).Uint64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("reconciler: cannot read where the last run ended: %w", err)
	}
	flat, next, err := rdb.ZScan(ctx, r.store.catalogKey(), start, "", r.page).Result()
	if err != nil {
		return fmt.Errorf("reconciler: cannot list the SKUs on sale: %w", err)
	}
	var skus []string
	for i := 0; i < len(flat); i += 2 { // member, score
		skus = append(skus, flat[i])
	}
	if err := rdb.Set(ctx, r.store.reconcileNextKey(), next, 0).Err(); err != nil {
		return fmt.Errorf("reconciler: cannot record where this run ends: %w", err)
	}
	audited, drifting := 0, 0
	for _, sku := range skus {
		a, err := r.audit.Audit(ctx, sku)
		switch {
		case errors.Is(err, inventory.ErrUnknownSKU), errors.Is(err, ErrSaleNotLoaded):
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
			if w := a.Written; w != nil && (w.Orders > a.Orders || w.Ordered > a.Ordered) {
				// The database holds orders Redis does not: Redis lost
				// accepted orders without a restart or a promotion (a
				// copy put back into the running server keeps its
				// replication id), and may sell their units again. The
				// check closes the sale (found by review).
				if err := r.store.recheckAs(ctx, sku, "force"); err != nil {
					r.log.Error("reconciler: checking the sale against the database failed", "sku", sku, "err", err)
				}
			}
		}
	}
	r.obs.Reconciled(audited, drifting)
	return nil
}
