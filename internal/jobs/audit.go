package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// Auditor audits one SKU: the service's audit, whatever the strategy
// (inventory.Service.Audit).
type Auditor interface {
	Audit(ctx context.Context, sku string) (inventory.Audit, error)
}

// SKULister lists the SKUs on sale.
type SKULister interface {
	SKUs(ctx context.Context) ([]string, error)
}

// AuditObserver hears each audit run's result, for metrics.
type AuditObserver interface {
	// Audited reports how many SKUs were audited and how many of them are
	// inconsistent.
	Audited(audited, inconsistent int)
}

// AuditJob audits every SKU on sale every period and reports the
// inconsistent ones: a log line each (error level) and the observer's
// count (of a run cut short, what it found). A SKU whose audit fails (a backend down) is logged and counted as
// not audited; the run then fails, so that the failure shows in the logs
// and the run's metrics.
func AuditJob(every time.Duration, skus SKULister, audit Auditor, log *slog.Logger, obs AuditObserver) Job {
	return Job{Name: "audit", Every: every, Run: func(ctx context.Context) error {
		list, err := skus.SKUs(ctx)
		if err != nil {
			return fmt.Errorf("list the SKUs: %w", err)
		}
		audited, inconsistent, failed := 0, 0, 0
		for _, sku := range list {
			a, err := audit.Audit(ctx, sku)
			if err != nil {
				if ctx.Err() != nil {
					// What was found so far still counts (found by
					// review: an audit that always ran out of time
					// never raised the gauge).
					obs.Audited(audited, inconsistent)
					return fmt.Errorf("audit stopped after %d of %d SKUs: %w", audited, len(list), context.Cause(ctx))
				}
				failed++
				log.Warn("audit of a SKU failed", "sku", sku, "err", err)
				continue
			}
			audited++
			if !a.Consistent() {
				inconsistent++
				log.Error("audit: SKU INCONSISTENT", "sku", sku, "initial", a.Initial, "available", a.Available,
					"ordered", a.Ordered, "orders", a.Orders, "pending", a.Pending, "drift", a.Drift)
			}
		}
		obs.Audited(audited, inconsistent)
		if failed > 0 {
			return fmt.Errorf("%d of %d SKUs could not be audited", failed, len(list))
		}
		return nil
	}}
}
