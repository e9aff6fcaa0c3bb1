package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// RedisRestart is scenario 4: the single Redis server of redis-lock is
// killed mid-load and restarted empty: 503s while it is gone, exact stock
// after.
func (e *Env) RedisRestart(ctx context.Context) Result {
	d, rate := e.scale(20*time.Second, 10*time.Second), 200.0
	ttl := 2 * time.Second
	r := e.newRun(4, "4-redis-restart/redis-lock", "the single Redis server of redis-lock killed mid-load, then restarted empty",
		Config{Engine: "postgres", Strategy: strategies.NameRedisLock, Safe: true, Instances: 3, RedisServers: 1,
			Fencing: "on", LockTTL: ttl.String(), OrderTimeout: "3s"})
	if err := r.setUp(ctx, 1, "FENCING=on", "LOCK_TTL="+ttl.String(), "LOCK_WAIT=2s"); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s4", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.6)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))
	pause(ctx, d/4)
	tk := r.event("kill -9 the Redis server")
	r.redis[0].kill()
	pause(ctx, d/5)
	tr := r.event("restart the Redis server empty")
	if err := r.redis[0].restartEmpty(); err != nil {
		return r.abort(err)
	}
	r.afterLoad = func(orders []*order) {
		// An order that started while Redis was gone may wait for its lock
		// (LOCK_WAIT) and sell once Redis is back; one answered 201 before
		// the restart sold without a lock.
		var soldWithoutLock int
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansCreated && a.call >= tk+ttl && a.ret < tr {
					soldWithoutLock++
				}
			}
		}
		if soldWithoutLock > 0 {
			r.fail("%d orders were sold while Redis was gone", soldWithoutLock)
		} else if gone := figures(orders, tk+ttl, tr); gone.Responses503 == 0 {
			r.warn("no 503 while Redis was gone")
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec > 10 {
			r.warn("no sale within 10s of the Redis server's restart")
		}
		// No instance was paused: every fenced-off write comes from the
		// fencing counters that the empty restart set back to zero.
		if f := r.res.Figures.FencedOffWrites; f != nil && *f > 0 {
			r.note("after the empty restart %.0f writes were fenced off: the fencing counter started again from 1, below "+
				"the tokens the rows had seen; each refusal pushes the counter past its row's fence (AdvanceFence), so "+
				"about one refused order per SKU is expected", *f)
		}
	}
	return r.finish(ctx, phaseMark{"Redis up", 0}, phaseMark{"Redis gone", tk}, phaseMark{"restarted empty", tr})
}

// loadThroughDatabaseCrash starts the sales of skus and the load, crashes
// the private database server after crashAfter (SIGKILL), and starts it
// again after down. It returns the load clock's times of the crash and of
// the start.
func (r *run) loadThroughDatabaseCrash(ctx context.Context, server *DBServer, skus []string, spec loadSpec, crashAfter, down time.Duration) (crashed, started time.Duration, err error) {
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return 0, 0, err
	}
	r.startLoad(ctx, skus, spec)
	pause(ctx, crashAfter)
	crashed = r.event("kill -9 the %s server", server.Engine)
	if err := server.Crash(); err != nil {
		return 0, 0, err
	}
	pause(ctx, down)
	started = r.event("start the %s server (crash recovery)", server.Engine)
	return crashed, started, server.Start(ctx)
}

// DatabaseRestart is scenario 5: the database (a private server) is
// crashed with SIGKILL mid-load and started again (crash recovery): 503s
// while it is gone, the instances' pools recover by themselves within
// seconds, and no order is lost or doubled.
func (e *Env) DatabaseRestart(ctx context.Context, server *DBServer) Result {
	d, rate := e.scale(20*time.Second, 10*time.Second), 250.0
	engine := "postgres"
	if server != nil {
		engine = server.Engine
	}
	r := e.newRun(5, "5-database-restart/"+engine+"/conditional", "the database crashed (kill -9) mid-load and restarted",
		Config{Engine: engine, Strategy: strategies.NameConditional, Safe: true, Instances: 3, OrderTimeout: "3s"})
	if server == nil {
		return r.abort(fmt.Errorf("%w: no private %s server", ErrMissing, engine))
	}
	url, err := server.NewDatabase(ctx, "faults_"+randomHex(4))
	if err != nil {
		return r.abort(err)
	}
	r.dbURL = url
	if err := r.setUp(ctx, 0); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s5", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.6)
	tk, tr, err := r.loadThroughDatabaseCrash(ctx, server, skus, sqlSpec(rate, d), d/4, 3*time.Second)
	if err != nil {
		return r.abort(err)
	}
	tu := r.event("the %s server answers", engine)
	r.afterLoad = func(orders []*order) {
		if gone := figures(orders, tk+time.Second, tr); gone.Created > 0 {
			r.fail("%d orders started while the database was down were answered 201", gone.Created)
		} else if gone.Responses503 == 0 {
			r.warn("no 503 while the database was down")
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		rec := r.res.Figures.RecoverySeconds
		if rec == nil || *rec-seconds(tu-tr) > 5 {
			r.warn("the instances did not sell within 5s of the database answering again")
		}
		if rec != nil {
			r.note("the database took %.2fs to answer after its start; the first 201 came %.2fs after that", seconds(tu-tr), *rec-seconds(tu-tr))
		}
	}
	return r.finish(ctx, phaseMark{"database up", 0}, phaseMark{"database down", tk}, phaseMark{"after the restart", tr})
}
