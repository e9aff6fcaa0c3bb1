package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/metrics"
)

// newScheduler returns the scheduler of the periodic jobs (the audit, the
// reservation reconciler), whose single-run lock is the lock table of the
// service's own database: every instance has it, whatever its strategy.
// The returned function closes the lock's pool.
func newScheduler(ctx context.Context, cfg config, m *metrics.Metrics, log *slog.Logger) (*jobs.Scheduler, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := dblock.Open(ctx, cfg.DatabaseURL, dblock.WithMaxConns(2))
	if err != nil {
		return nil, nil, fmt.Errorf("job lock: %w", err)
	}
	lock := jobs.LockFunc(func(ctx context.Context, name string, atMost time.Duration) (jobs.Held, bool, error) {
		h, ok, err := l.TryLock(ctx, name, atMost)
		if !ok {
			return nil, false, err // never a typed nil
		}
		return h, true, nil
	})
	return jobs.New(lock, jobs.WithLogger(log), jobs.WithObserver(m)), func() { _ = l.Close() }, nil
}
