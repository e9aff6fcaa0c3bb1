package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/semaphore"
)

// buildAdmission puts s behind ADMISSION_LIMIT places per SKU across every
// instance: a fair semaphore on the first Redis of REDIS_ADDRS. The order
// waits in its instance's row gate (ROW_MAX_IN_FLIGHT) first, so that at
// most that many of an instance's orders poll Redis. A permit lasts twice
// ORDER_TIMEOUT, longer than any order holds it.
func buildAdmission(cfg config, s inventory.Strategy, log *slog.Logger) (inventory.Strategy, func(), error) {
	rdb := redis.NewClient(redisOptions(cfg.RedisAddrs[0]))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("ADMISSION_LIMIT needs Redis (REDIS_ADDRS %s): %w", cfg.RedisAddrs[0], err)
	}
	sem, err := semaphore.New(rdb, cfg.AdmissionLimit, semaphore.WithLease(2*cfg.OrderTimeout))
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	log.Info("admission: at most ADMISSION_LIMIT orders per SKU in the database at once, across the instances",
		"admission_limit", cfg.AdmissionLimit, "redis", cfg.RedisAddrs[0])
	admitted, err := inventory.AdmitThrough(unwrapRowGate(s), inventorylock.Admission(sem))
	if err == nil {
		admitted, err = inventory.LimitRowWork(admitted, cfg.RowMaxInFlight)
	}
	if err != nil {
		_ = sem.Close()
		_ = rdb.Close()
		return nil, nil, err
	}
	return admitted, func() {
		_ = sem.Close()
		_ = rdb.Close()
	}, nil
}

// unwrapRowGate returns the strategy inside a row gate, so that the gate
// goes in front of the admission (which then sees at most
// ROW_MAX_IN_FLIGHT of this instance's orders per SKU).
func unwrapRowGate(s inventory.Strategy) inventory.Strategy {
	if g, ok := s.(*inventory.RowGated); ok {
		return g.Inner()
	}
	return s
}
