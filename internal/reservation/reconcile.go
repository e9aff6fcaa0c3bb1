package reservation

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

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

// Reconciler audits every SKU on sale every period, on one instance at a
// time, and reports the SKUs whose Redis and database disagree: a log line
// each and the observer's figures. One instance at a time holds a lease in
// Redis for the run (SET NX PX, released by its owner only); the job lock
// of the database locks will replace it.
type Reconciler struct {
	store  *Store
	audit  Auditor
	every  time.Duration
	log    *slog.Logger
	obs    ReconcileObserver
	holder string
}

// NewReconciler returns a reconciler of s's SKUs through audit, run every
// period by Run.
func (s *Store) NewReconciler(audit Auditor, every time.Duration, log *slog.Logger, obs ReconcileObserver) *Reconciler {
	return &Reconciler{store: s, audit: audit, every: every, log: log, obs: obs, holder: uuid.NewString()}
}

// releaseLease deletes the lease only if this holder still has it.
var releaseLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// Run reconciles every period until ctx ends.
func (r *Reconciler) Run(ctx context.Context) {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.Once(ctx)
		}
	}
}

// Once runs one reconciliation if no other instance is running one, and
// reports whether it ran.
func (r *Reconciler) Once(ctx context.Context) bool {
	key := r.store.prefix + "reserve:reconciler"
	// The lease outlives a run (bounded by its own deadline) and expires
	// by itself if its holder dies.
	ok, err := r.store.rdb.SetNX(ctx, key, r.holder, 2*r.every).Result()
	if err != nil || !ok {
		return false
	}
	defer func() { _ = releaseLease.Run(context.WithoutCancel(ctx), r.store.rdb, []string{key}, r.holder).Err() }()
	runCtx, cancel := context.WithTimeout(ctx, r.every)
	defer cancel()
	skus, err := r.store.rdb.SMembers(runCtx, r.store.skusKey()).Result()
	if err != nil {
		r.log.Warn("reconciler: cannot list the SKUs on sale", "err", err)
		return true
	}
	audited, drifting := 0, 0
	for _, sku := range skus {
		a, err := r.audit.Audit(runCtx, sku)
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
	return true
}
