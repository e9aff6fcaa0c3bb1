package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// ReserveRedisRestart is scenario 8's first run: the durable Redis that
// holds redis-reserve's stock and accepted orders is killed mid-load
// (SIGKILL) and restarted with its append-only file. Orders get 503 while it
// is gone; afterwards the instances find the reserve script gone (a
// restart), check Redis against the database, and sell again; and nothing
// answered 201 is lost: every such order is a row once the streams drain.
func (e *Env) ReserveRedisRestart(ctx context.Context, strategy string) Result {
	d, rate := e.scale(16*time.Second, 8*time.Second), e.scaleRate(500, 200)
	r := e.newRun(8, "8-reserve-redis-restart/postgres/"+strategy,
		"the durable Redis of "+strategy+" killed mid-load, then restarted with its append-only file",
		Config{Engine: "postgres", Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
	node, err := r.loadOnReservationRedis(ctx, "s8", rate, d)
	if err != nil {
		return r.abort(err)
	}
	pause(ctx, d/4)
	tk := r.event("kill -9 the reservation Redis")
	node.kill()
	pause(ctx, d/8)
	tr := r.event("restart the reservation Redis with its append-only file")
	if err := node.restartDurable(); err != nil {
		return r.abort(err)
	}
	r.afterLoad = func(orders []*order) {
		// An order may wait out the outage (its answer lost, its retries
		// refused until Redis is back) and sell after the restart; none can
		// be answered 201 while Redis is down.
		var soldWhileDown int
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansCreated && a.call >= tk && a.ret < tr {
					soldWhileDown++
				}
			}
		}
		if soldWhileDown > 0 {
			r.fail("%d orders were answered 201 while Redis was down", soldWhileDown)
		} else if gone := figures(orders, tk+time.Second, tr); gone.Responses503 == 0 {
			r.warn("no 503 while Redis was down")
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec > 5 {
			r.warn("no sale within 5s of the Redis restart")
		}
	}
	return r.finish(ctx, phaseMark{"Redis up", 0}, phaseMark{"Redis gone", tk}, phaseMark{"restarted with its AOF", tr})
}

// ReserveRedisWiped is scenario 8's next run: the durable Redis of
// redis-reserve is killed mid-load and comes back without its data (a lost
// disk, a failover to an empty replica). From the kill on no order may be
// answered 201: the instances find no sale in Redis and fail closed (503)
// rather than sell from an empty key, until an operator starts the sale
// again (the run does not: it checks that the instances keep refusing). The
// orders still in the stream at the kill are lost with it, as
// docs/design/reservation-durability.md says; the run counts them (each was answered before the kill) and checks
// the database on its own: no oversell, the stock row's units all in order
// rows, no row without its request.
func (e *Env) ReserveRedisWiped(ctx context.Context) Result {
	d, rate := e.scale(12*time.Second, 6*time.Second), e.scaleRate(500, 200)
	strategy := strategies.NameRedisReserve
	r := e.newRun(8, "8-reserve-redis-wiped/postgres/"+strategy,
		"the durable Redis of "+strategy+" killed mid-load, then restarted without its data",
		Config{Engine: "postgres", Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
	node, err := r.loadOnReservationRedis(ctx, "s8w", rate, d)
	if err != nil {
		return r.abort(err)
	}
	pause(ctx, d/3)
	tk := r.event("kill -9 the reservation Redis")
	r.redisLostAt = &tk
	node.kill()
	pause(ctx, d/12)
	tr := r.event("restart the reservation Redis without its data")
	if err := node.restartWiped(); err != nil {
		return r.abort(err)
	}
	r.afterLoad = func(orders []*order) {
		var soldAfter int
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansCreated && a.call >= tk {
					soldAfter++
				}
			}
		}
		if soldAfter > 0 {
			r.fail("%d orders placed after the kill were answered 201: sold without a sale in Redis", soldAfter)
		}
		empty := figures(orders, tr+time.Second, r.load.now())
		if empty.Requests == 0 {
			r.warn("no order was placed against the empty Redis")
		} else {
			r.note("against the empty Redis: %d requests, %d answered 503 (fails closed), %d 201", empty.Requests, empty.Responses503, empty.Created)
		}
	}
	return r.finish(ctx, phaseMark{"Redis up", 0}, phaseMark{"Redis gone", tk}, phaseMark{"back without its data", tr})
}

// ReserveDatabaseDown is scenario 8's second run: the database (a private
// server) crashes mid-load while redis-reserve keeps selling from Redis.
// Orders keep being answered 201 while it is down (they wait in the
// streams); once it is back the consumers write them all, and every 201 is
// a row.
func (e *Env) ReserveDatabaseDown(ctx context.Context, server *DBServer, strategy string) Result {
	d, rate := e.scale(16*time.Second, 8*time.Second), e.scaleRate(500, 200)
	engine := "postgres"
	if server != nil {
		engine = server.Engine
	}
	r := e.newRun(8, fmt.Sprintf("8-reserve-database-down/%s/%s", engine, strategy),
		"the database crashed (kill -9) mid-load and restarted while "+strategy+" sells from Redis",
		Config{Engine: engine, Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
	if server == nil {
		return r.abort(fmt.Errorf("%w: no private %s server", ErrMissing, engine))
	}
	url, err := server.NewDatabase(ctx, "faults_"+randomHex(4))
	if err != nil {
		return r.abort(err)
	}
	r.dbURL = url
	rEnv, err := r.startReservationRedis()
	if err != nil {
		return r.abort(err)
	}
	if err := r.setUp(ctx, 0, rEnv, "RESERVE_CLAIM_IDLE=1s"); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s8d", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	tk, tr, err := r.loadThroughDatabaseCrash(ctx, server, skus, sqlSpec(rate, d), d/4, d/4)
	if err != nil {
		return r.abort(err)
	}
	r.afterLoad = func(orders []*order) {
		down := figures(orders, tk+time.Second, tr)
		if down.Created == 0 {
			r.fail("no order was answered 201 while the database was down: %s should sell from Redis", strategy)
		}
		if down.Responses503 > 0 {
			r.warn("%d answers were 503 while the database was down", down.Responses503)
		}
		r.note("%d orders answered 201 while the database was down, written after its restart", down.Created)
	}
	return r.finish(ctx, phaseMark{"database up", 0}, phaseMark{"database down", tk}, phaseMark{"restarted", tr})
}

// loadOnReservationRedis starts the run's durable Redis and its instances,
// puts 4 SKUs named after prefix on sale, and starts rate orders/s for d on
// them. It returns the Redis, for the scenario to fault.
func (r *run) loadOnReservationRedis(ctx context.Context, prefix string, rate float64, d time.Duration) (*redisNode, error) {
	rEnv, err := r.startReservationRedis()
	if err != nil {
		return nil, err
	}
	if err := r.setUp(ctx, 0, rEnv, "RESERVE_CLAIM_IDLE=1s"); err != nil {
		return nil, err
	}
	skus := skuNames(prefix, 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return nil, err
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))
	return r.redis[len(r.redis)-1], nil
}
