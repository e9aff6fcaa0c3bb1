package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/sales"
)

// Sweeper expires lapsed holds and returns their units
// (sales.Service.ExpireHolds).
type Sweeper interface {
	ExpireHolds(ctx context.Context, batch int) (int, error)
}

// SweepJob expires the lapsed holds every period, on one instance a period
// (the scheduler's lock). The lock is for economy, not safety: each expiry
// is a conditional UPDATE that skips rows another transaction holds, so two
// sweepers (a run that outlived its "at most", a lazy expiry) never return
// a unit twice. A run goes on until no lapsed hold is left or its "at
// most" (the period) ends; what it leaves, the next run takes.
//
// A run its period cut short (more lapsed holds than one period expires,
// a slow database) is a warning with its duration, not a failure: what it
// expired committed, and the next run goes on from there.
func SweepJob(every time.Duration, sweep Sweeper, log *slog.Logger) Job {
	return Job{Name: "hold-sweep", Every: every, Run: func(ctx context.Context) error {
		began := time.Now()
		n, err := sweep.ExpireHolds(ctx, sales.DefaultSweepBatch)
		if n > 0 {
			log.Info("expired lapsed holds", "orders", n)
		}
		if err != nil && ctx.Err() != nil {
			log.Warn("hold sweep ran to the end of its period: the next run takes the holds left",
				"orders", n, "took", time.Since(began), "period", every, "err", err)
			return nil
		}
		return err
	}}
}
