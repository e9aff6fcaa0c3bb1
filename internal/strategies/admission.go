package strategies

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/semaphore"
	"github.com/flashsale/stock/internal/sqlrow"
)

// admit puts s behind ADMISSION_LIMIT places per SKU across every
// instance: a fair semaphore on the first Redis of REDIS_ADDRS. A permit
// lasts twice ORDER_TIMEOUT, longer than any order holds it.
func admit(ctx context.Context, cfg Config, s inventory.Strategy, log *slog.Logger) (inventory.Strategy, func(), error) {
	rdb, where := RedisClient(cfg, RedisTuning{})
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return inventory.Strategy{}, nil, fmt.Errorf("ADMISSION_LIMIT needs Redis (REDIS_ADDRS %s): %w", where, err)
	}
	sem, err := semaphore.New(rdb, cfg.AdmissionLimit, semaphore.WithLease(2*cfg.OrderTimeout))
	if err != nil {
		_ = rdb.Close()
		return inventory.Strategy{}, nil, err
	}
	log.Info("admission: at most ADMISSION_LIMIT orders per SKU in the database at once, across the instances",
		"admission_limit", cfg.AdmissionLimit, "redis", where)
	stop := func() {
		_ = sem.Close()
		_ = rdb.Close()
	}
	admitted, err := sqlrow.AdmitThrough(s, inventorylock.Admission(sem))
	if err != nil {
		stop()
		return inventory.Strategy{}, nil, err
	}
	return admitted, stop, nil
}
