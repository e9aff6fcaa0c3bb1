package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// Auditor audits one SKU: the service's audit, whatever the strategy
// (sales.Service.Audit).
type Auditor interface {
	Audit(ctx context.Context, sku string) (inventory.Audit, error)
}

// SKULister lists the SKUs on sale, in order, a page at a time: at most
// limit of them that sort after after ("" for the first).
type SKULister interface {
	SKUsAfter(ctx context.Context, after string, limit int) ([]string, error)
}

// AuditPage is how many SKUs one run of the audit job audits: a run costs
// a page, not the catalog. With 10,000 SKUs on sale and a run every 30 s,
// every SKU is audited every 5 minutes; a catalog of at most a page is
// audited whole at every run.
const AuditPage = 1000

// AuditObserver hears each audit run's result, for metrics.
type AuditObserver interface {
	// Audited reports how many SKUs were audited and how many of them are
	// inconsistent.
	Audited(audited, inconsistent int)
}

// AuditJob audits a page of the SKUs on sale (AuditPage) every period,
// going on after the last SKU the previous run of this process audited and
// starting over at the end, and reports the inconsistent ones: a log line
// each (error level) and the observer's count (of a run cut short, what it
// found). A SKU whose audit fails (a backend down) is logged and counted
// as not audited; the run then fails, so that the failure shows in the
// logs and the run's metrics.
//
// Where the walk stands is kept in this process only: the job runs on one
// instance a period (the scheduler's lock), so with several instances
// each walks on from where it last was, and every SKU is still audited
// within catalog/AuditPage runs of each instance.
func AuditJob(every time.Duration, skus SKULister, audit Auditor, log *slog.Logger, obs AuditObserver) Job {
	var (
		mu    sync.Mutex // runs of one job do not overlap; this is for the race detector's sake
		after string
	)
	return Job{Name: "audit", Every: every, Run: func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		list, err := skus.SKUsAfter(ctx, after, AuditPage)
		if err != nil {
			return fmt.Errorf("list the SKUs: %w", err)
		}
		if len(list) < AuditPage {
			after = "" // the end: the next run starts over
		} else {
			after = list[len(list)-1]
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
