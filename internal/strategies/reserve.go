package strategies

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/jobs"
	"github.com/flashsale/stock/internal/redisconn"
	"github.com/flashsale/stock/internal/reservation"
)

// buildReserve (redis-reserve, redis-watch) connects to the reservation
// Redis (RedisClient, or with REDIS_MODE=cluster the cluster REDIS_ADDRS
// seed), refuses one that could lose or evict an accepted order, and
// starts this instance's consumer of the order streams. Its reconciler
// (RESERVE_RECONCILE_EVERY) is a job of sched: one instance a period runs
// it. The returned stop function ends the consumer (it finishes the batch
// in hand), waits for it, and closes the client.
func buildReserve(cfg Config, optimistic bool, deps Deps) (inventory.Strategy, func(), error) {
	db, m, sched, log := deps.DB, deps.Metrics, deps.Jobs, deps.Log
	rdb, where := newReserveClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return inventory.Strategy{}, nil, fmt.Errorf("reservation redis %s: %w", where, err)
	}
	if err := reservation.CheckMaster(ctx, rdb); err != nil {
		_ = rdb.Close()
		return inventory.Strategy{}, nil, fmt.Errorf("reservation redis: %w", err)
	}
	if err := reservation.CheckNoEviction(ctx, rdb); err != nil {
		_ = rdb.Close()
		return inventory.Strategy{}, nil, fmt.Errorf("%w (start it with --maxmemory-policy noeviction)", err)
	}
	if cfg.ReserveDurable {
		if err := reservation.CheckDurable(ctx, rdb); err != nil {
			_ = rdb.Close()
			return inventory.Strategy{}, nil, fmt.Errorf("%w: start it with --appendonly yes --appendfsync always, or set RESERVE_DURABILITY=none for a demo that may lose orders", err)
		}
	} else {
		log.Warn("RESERVE_DURABILITY=none: orders are answered 201 before Redis has them on disk. " +
			"A crash of Redis or of the machine loses them, and the database never sees them. Never use it for a real sale.")
	}
	opts := []reservation.Option{reservation.WithLogger(log), reservation.WithPipelines(cfg.ReservePipelines),
		reservation.WithReplicas(cfg.ReserveWaitReplicas, cfg.ReserveWaitTimeout)}
	var strategyOpts []reservation.ReservedOption
	if optimistic {
		// The optimistic variant is bounded like version-cas.
		opts = append(opts, reservation.WithOptimisticTransactions(cfg.CASMaxAttempts, cfg.CASMaxInFlight))
		strategyOpts = append(strategyOpts, reservation.WithReservedName(NameRedisWatch))
	}
	res := reservation.New(rdb, db, opts...)
	consumer := res.NewConsumer(db, reservation.WithClaimIdle(cfg.ReserveClaimIdle),
		reservation.WithConsumerLogger(log), reservation.WithConsumerObserver(m))
	reserved := reservation.NewReserved(res, db, strategyOpts...)
	runCtx, stopBackground := context.WithCancel(context.Background())
	var background sync.WaitGroup
	background.Go(func() {
		if err := consumer.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("reservation consumer", "err", err)
		}
	})
	log.Info("reservation consumer started", "consumer", consumer.Name(), "redis", where)
	if cfg.ReconcileEvery > 0 {
		reconciler := res.NewReconciler(reserved, log, m)
		if err := sched.Add(jobs.Job{Name: "reconcile", Every: cfg.ReconcileEvery, Run: reconciler.Reconcile}); err != nil {
			stopBackground()
			background.Wait()
			_ = rdb.Close()
			return inventory.Strategy{}, nil, err
		}
	}
	stop := func() {
		stopBackground()
		background.Wait()
		_ = rdb.Close()
	}
	return reserved.Strategy(), stop, nil
}

// newReserveClient returns the client of the reservation Redis and where
// it points, for messages. It sends nothing again by itself
// (redisOptions): Reserve retries its own script, which is safe to
// repeat, and a retried Load is refused or a no-op. Every order holds a
// connection for one round trip: a pool larger than go-redis' default
// (10 per CPU) would only queue at Redis instead of here.
func newReserveClient(cfg Config) (rdb redis.UniversalClient, where string) {
	if cfg.RedisCluster {
		// A cluster redirects (MOVED, ASK) before it runs anything, so
		// following redirections is safe; the client does it.
		opt := redisconn.ClusterOptions(cfg.RedisAddrs)
		opt.PoolSize = 64
		return redis.NewClusterClient(opt), "cluster " + strings.Join(cfg.RedisAddrs, ",")
	}
	return RedisClient(cfg, RedisTuning{PoolSize: 64})
}

// reserveEntry is redis-reserve's entry (one Lua script per order), or with
// optimistic redis-watch's (WATCH/MULTI/EXEC, bounded like version-cas by
// CAS_MAX_ATTEMPTS and CAS_MAX_IN_FLIGHT). RESERVE_PIPELINES is the
// script's alone: redis-watch's transactions cannot share a pipeline.
func reserveEntry(info Info, optimistic bool) Entry {
	settings := reserveSettings
	if !optimistic {
		settings = append(slices.Clone(settings), "RESERVE_PIPELINES")
	}
	return Entry{Info: info, Settings: settings, Build: func(_ context.Context, cfg Config, deps Deps) (inventory.Strategy, func(), error) {
		return buildReserve(cfg, optimistic, deps)
	}}
}
