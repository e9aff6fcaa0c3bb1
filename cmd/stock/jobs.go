package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/locking/dblock"
	"github.com/flashsale/stock/internal/locking/redislock"
	"github.com/flashsale/stock/internal/metrics"
	"github.com/flashsale/stock/internal/strategies"
)

// newScheduler returns the scheduler of the periodic jobs (the audit, the
// reservation reconciler). Its single-run lock is, by default (JOB_LOCK
// table), the lock table of the service's own database: every instance has
// it, whatever its strategy; JOB_LOCK=redis puts it on the first Redis of
// REDIS_ADDRS. The returned function closes the lock's connections.
func newScheduler(ctx context.Context, cfg config, m *metrics.Metrics, log *slog.Logger) (*jobs.Scheduler, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if cfg.JobLock == "redis" {
		rdb, where := strategies.RedisClient(cfg.strategyConfig(), strategies.RedisTuning{PoolSize: 2})
		if err := rdb.Ping(ctx).Err(); err != nil {
			_ = rdb.Close()
			return nil, nil, fmt.Errorf("job lock: JOB_LOCK=redis needs Redis (REDIS_ADDRS %s): %w", where, err)
		}
		lock := jobs.LockOf(redislock.NewJobLocker(rdb, "job-lock:").TryLock)
		return jobs.New(lock, jobs.WithLogger(log), jobs.WithObserver(m)), func() { _ = rdb.Close() }, nil
	}
	l, err := dblock.Open(ctx, cfg.DatabaseURL, dblock.WithMaxConns(2))
	if err != nil {
		return nil, nil, fmt.Errorf("job lock: %w", err)
	}
	return jobs.New(jobs.LockOf(l.TryLock), jobs.WithLogger(log), jobs.WithObserver(m)), func() { _ = l.Close() }, nil
}
