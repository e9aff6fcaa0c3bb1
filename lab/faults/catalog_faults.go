package faults

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"golang.org/x/sync/errgroup"
)

// Scenario 9 runs four faults with a catalog on sale (catalog.go): the
// reservation Redis restarted from its append-only file and wiped
// (redis-reserve and redis-watch), the database crashed, and an instance
// killed (redis-reserve, batched and conditional). Each reports the time
// to the first 201 after the fault, the rate and the 503s after it, how
// long the first order of each SKU ordered after it took, and the audit of
// every SKU of the catalog with the worst named.

// catalogSpec is the load of the catalog runs: rate orders per second from
// 64 workers (most answers take milliseconds), for d and up to a minute
// more: the scenario stops it (loadUntil).
func catalogSpec(rate float64, d time.Duration) loadSpec {
	d += time.Minute
	return loadSpec{workers: 64, rate: rate, duration: d, maxOrders: int(rate * d.Seconds()), timeout: 5 * time.Second}
}

// afterFaultLoad is how long the load of a catalog run goes on at least
// after its fault is over.
func (e *Env) afterFaultLoad() time.Duration { return e.scale(10*time.Second, 4*time.Second) }

// catalogRate is the load of the catalog runs: 300 orders per second
// (short form 150) over three instances.
func (e *Env) catalogRate() float64 { return e.scaleRate(300, 150) }

// newCatalogRun starts a catalog run's cluster of three instances on a
// database of engine (a fresh one on server when it is not nil), with a
// durable Redis for the reserved strategies.
func (e *Env) newCatalogRun(ctx context.Context, name, title string, engine, strategy string, server *DBServer) (*run, error) {
	cfg := Config{Engine: engine, Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"}
	r := e.newRun(9, name, fmt.Sprintf("%d SKUs on sale, a few hot: %s", e.catalogSize(), title), cfg)
	if server != nil {
		url, err := server.NewDatabase(ctx, "faults_"+randomHex(4))
		if err != nil {
			return r, err
		}
		r.dbURL = url
	}
	var env []string
	if isReserved(strategy) {
		// A killed instance's consumer may hold a batch read and not yet
		// written: another instance claims it after a second.
		rEnv, err := r.startReservationRedis()
		if err != nil {
			return r, err
		}
		env = append(env, rEnv, "RESERVE_CLAIM_IDLE=1s")
	}
	return r, r.setUp(ctx, 0, env...)
}

// CatalogRedisRestart is scenario 9's Redis restart: the durable Redis of
// redis-reserve or redis-watch is killed (SIGKILL) under a load over the
// catalog, and started again from its append-only file. Each SKU's sale
// is checked against the database when it is first ordered after the
// restart, so the SKUs ordered sell again at once, whatever the size of
// the catalog: the first 201 is expected within a second of the restarted
// Redis answering (loading its append-only file takes Redis longer, the
// larger the file: both times are reported).
func (e *Env) CatalogRedisRestart(ctx context.Context, strategy string) Result {
	d := e.scale(24*time.Second, 8*time.Second)
	r, err := e.newCatalogRun(ctx, "9-catalog-redis-restart/postgres/"+strategy,
		"the durable Redis of "+strategy+" killed mid-load, then restarted with its append-only file", "postgres", strategy, nil)
	if err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	if err := r.loadOnCatalog(ctx, newCatalog("s9r", e.catalogSize()), catalogSpec(e.catalogRate(), d), d, 0.7); err != nil {
		return r.abort(err)
	}
	node := r.redis[len(r.redis)-1]
	pause(ctx, d/4)
	tk := r.event("kill -9 the reservation Redis")
	node.kill()
	pause(ctx, e.scale(2*time.Second, time.Second))
	aof := node.aofBytes()
	tr := r.event("restart the reservation Redis with its append-only file (%d bytes)", aof)
	if err := node.restartDurable(); err != nil {
		return r.abort(err)
	}
	tu := r.event("the reservation Redis answers")
	stopped := r.loadUntil(ctx, d, tu, e.afterFaultLoad())
	r.afterLoad = func(orders []*order) {
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
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		af := afterFault(orders, tk, tu, stopped, "the restarted Redis answers", nil)
		r.res.Catalog.AfterFault = af
		// The service cannot sell before its Redis answers: the second is
		// counted from then; the time Redis takes to load its file is
		// Redis's, and grows with the file, whatever the service does.
		switch rec := af.FirstCreatedS; {
		case rec == nil:
			r.warn("no 201 after the Redis restart")
		case *rec > 1:
			r.warn("the first 201 came %.2fs after the restarted Redis answered, over the 1s expected", *rec)
		}
		r.note("Redis took %.2fs to load its append-only file (%d bytes) and answer; the first 201 came %s after that, %s after the restart began",
			seconds(tu-tr), aof, orNever(af.FirstCreatedS), orNever(r.res.Figures.RecoverySeconds))
		if af.SKUsFirstRefused > 0 {
			r.warn("%d of the %d SKUs ordered once Redis answered were refused at their first order (%s: %s)",
				af.SKUsFirstRefused, af.SKUsOrdered, af.RefusedSKU, af.RefusedAnswer)
		}
		if af.SKUsOverASecond > 0 {
			r.warn("%d of the %d SKUs ordered once Redis answered waited over a second for the answer to their first order (the slowest, %s, %.2fs; the median %.3fs)",
				af.SKUsOverASecond, af.SKUsOrdered, af.SlowestSKU, af.SlowestFirstAnswerS, af.MedianFirstAnswerS)
		}
	}
	r.afterRows = func([]*order, []orderRow) { r.countChecks(ctx) }
	return r.finish(ctx, phaseMark{"Redis up", 0}, phaseMark{"Redis gone", tk}, phaseMark{"restarted with its AOF", tr})
}

// CatalogRedisWiped is scenario 9's Redis wipe: the durable Redis is
// killed under the load and comes back without its data. Every SKU must
// then fail closed (503, nothing sold from an empty key) until its sale is
// started again. Longer than any order takes after the loss, the run
// starts again the sales of the 100 hottest SKUs (short form 50) through
// PUT /admin/stock, adminWorkers at a time, and measures the time to the
// first 201 from the start of that; the rest of the catalog keeps failing
// closed to the end. The first sale of a SKU started again is checked
// from what the database held just before (the new sale deletes its rows),
// the second from its audit in Redis.
func (e *Env) CatalogRedisWiped(ctx context.Context, strategy string) Result {
	d := e.scale(30*time.Second, 14*time.Second)
	r, err := e.newCatalogRun(ctx, "9-catalog-redis-wiped/postgres/"+strategy,
		"the durable Redis of "+strategy+" killed mid-load, then restarted without its data; the hottest sales started again", "postgres", strategy, nil)
	if err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	cat := newCatalog("s9w", e.catalogSize())
	spec := catalogSpec(e.catalogRate(), d)
	spec.timeout = 4 * time.Second
	if err := r.loadOnCatalog(ctx, cat, spec, d, 0.7); err != nil {
		return r.abort(err)
	}
	node := r.redis[len(r.redis)-1]
	pause(ctx, d/4)
	tk := r.event("kill -9 the reservation Redis")
	r.redisLostAt = &tk
	node.kill()
	pause(ctx, time.Second)
	tw := r.event("restart the reservation Redis without its data")
	if err := node.restartWiped(); err != nil {
		return r.abort(err)
	}
	// Longer than any order called before the loss can take (the client
	// gives up after spec.timeout), so that every order of a new sale was
	// called after the loss (splitSales).
	pause(ctx, tk+spec.timeout+1500*time.Millisecond-r.load.now())
	before, err := r.snapshotDatabase(ctx)
	if err != nil {
		return r.abort(err)
	}
	again := cat.hot(int(e.scaleRate(100, 50)))
	stock := cat.stock(again, spec.rate, d-r.load.now(), 0.7)
	tb := r.event("start the sales of the %d hottest SKUs again", len(again))
	startedAt, err := r.startSalesAgain(ctx, stock)
	if err != nil {
		return r.abort(err)
	}
	te := r.event("the %d sales are started again", len(again))
	r.restarted, r.before = stock, before
	r.res.Catalog.Restarted, r.res.Catalog.RestartedSeconds = len(again), seconds(te-tb)
	stopped := r.loadUntil(ctx, d, te, e.afterFaultLoad())
	r.afterLoad = func(orders []*order) {
		var early, closed int
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer != ansCreated || a.call < tk {
					continue
				}
				at, again := startedAt[o.sku]
				switch {
				case !again:
					closed++
				case a.ret < at:
					early++
				}
			}
		}
		if early+closed > 0 {
			r.fail("after the loss, %d orders of SKUs whose sale was not started again, and %d before it was, were answered 201: sold without a sale in Redis", closed, early)
		}
		empty := figures(orders, tw+time.Second, tb)
		r.note("against the empty Redis, before any sale was started again: %d requests, %d answered 503 (fails closed), %d 201",
			empty.Requests, empty.Responses503, empty.Created)
		if empty.Requests == 0 {
			r.warn("no order was placed against the empty Redis")
		}
		only := map[string]bool{}
		for _, sku := range again {
			only[sku] = true
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tb, -1)
		af := afterFault(orders, tk, te, stopped, "the hot sales are started again (their orders only)", only)
		r.res.Catalog.AfterFault = af
		r.note("the %d sales took %.2fs to start again (%d at a time); the first 201 came %s after their start",
			len(again), seconds(te-tb), adminWorkers, orNever(r.res.Figures.RecoverySeconds))
		if r.res.Figures.RecoverySeconds == nil {
			r.warn("no 201 after the sales were started again")
		}
		if af.SKUsFirstRefused > 0 {
			r.warn("%d of the %d SKUs started again and ordered afterwards were refused at their first order (%s: %s)",
				af.SKUsFirstRefused, af.SKUsOrdered, af.RefusedSKU, af.RefusedAnswer)
		}
		cold := map[string]bool{}
		for _, sku := range cat.skus[len(again):] {
			cold[sku] = true
		}
		if c := figures(filterOrders(orders, cold), tb, stopped); c.Requests > 0 {
			r.note("the SKUs not started again: %d requests after the others' restart, %d answered 503, %d 201",
				c.Requests, c.Responses503, c.Created)
		}
	}
	return r.finish(ctx, phaseMark{"Redis up", 0}, phaseMark{"Redis gone", tk}, phaseMark{"back without its data", tw},
		phaseMark{"hot sales started again", tb})
}

// startSalesAgain starts the sales of stock, adminWorkers at a time, and
// returns when each PUT began, on the load's clock.
func (r *run) startSalesAgain(ctx context.Context, stock map[string]int64) (map[string]time.Duration, error) {
	var mu sync.Mutex
	began := map[string]time.Duration{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(adminWorkers)
	for i, sku := range slices.Sorted(maps.Keys(stock)) {
		g.Go(func() error {
			mu.Lock()
			began[sku] = r.load.now()
			mu.Unlock()
			return r.cluster.StartSaleVia(gctx, i%len(r.cluster.Instances), sku, stock[sku])
		})
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("start the sales again: %w", err)
	}
	return began, nil
}

// CatalogDatabaseKill is scenario 9's database crash: the database (a
// private server) is killed with SIGKILL under the load over the catalog
// and started again (crash recovery). A SQL strategy answers 503 while it
// is gone and sells again once it answers; redis-reserve keeps selling
// from Redis and writes the orders afterwards.
func (e *Env) CatalogDatabaseKill(ctx context.Context, server *DBServer, strategy string) Result {
	d := e.scale(20*time.Second, 12*time.Second)
	engine := "postgres"
	if server != nil {
		engine = server.Engine
	}
	name := fmt.Sprintf("9-catalog-database-kill/%s/%s", engine, strategy)
	title := "the database crashed (kill -9) mid-load and restarted"
	if server == nil {
		r := e.newRun(9, name, title, Config{Engine: engine, Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
		return r.abort(fmt.Errorf("%w: no private %s server", ErrMissing, engine))
	}
	r, err := e.newCatalogRun(ctx, name, title, engine, strategy, server)
	if err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	if err := r.loadOnCatalog(ctx, newCatalog("s9d", e.catalogSize()), catalogSpec(e.catalogRate(), d), d, 0.7); err != nil {
		return r.abort(err)
	}
	pause(ctx, e.scale(d/4, 2*time.Second))
	tk := r.event("kill -9 the %s server", engine)
	if err := server.Crash(); err != nil {
		return r.abort(err)
	}
	pause(ctx, e.scale(3*time.Second, 1500*time.Millisecond))
	tr := r.event("start the %s server (crash recovery)", engine)
	if err := server.Start(ctx); err != nil {
		return r.abort(err)
	}
	tu := r.event("the %s server answers", engine)
	stopped := r.loadUntil(ctx, d, tu, e.afterFaultLoad())
	r.afterLoad = func(orders []*order) {
		down := figures(orders, tk+time.Second, tr)
		switch {
		case isReserved(strategy) && down.Created == 0:
			r.fail("no order was answered 201 while the database was down: %s should sell from Redis", strategy)
		case isReserved(strategy):
			r.note("%d orders answered 201 while the database was down, written after its restart", down.Created)
		case down.Created > 0:
			r.fail("%d orders started while the database was down were answered 201", down.Created)
		case down.Responses503 == 0:
			r.warn("no 503 while the database was down")
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		r.res.Catalog.AfterFault = afterFault(orders, tk, tu, stopped, "the restarted database answers", nil)
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec-seconds(tu-tr) > 5 {
			r.warn("the instances did not sell within 5s of the database answering again")
		}
		r.note("the database took %.2fs to answer after its start; the first 201 came %s after the start", seconds(tu-tr), orNever(r.res.Figures.RecoverySeconds))
	}
	return r.finish(ctx, phaseMark{"database up", 0}, phaseMark{"database down", tk}, phaseMark{"after the restart", tr})
}

// CatalogInstanceKill is scenario 9's instance kill: one of the three
// instances is killed with SIGKILL under the load over the catalog and
// started again. Every 201 must be a row, the rows whose answer was lost
// at most the requests in flight at the kill; the restarted instance must
// sell again. (The batched strategy's mid-batch kill, checked batch by
// batch, is scenario 1's.)
func (e *Env) CatalogInstanceKill(ctx context.Context, engine, strategy string) Result {
	d := e.scale(16*time.Second, 8*time.Second)
	r, err := e.newCatalogRun(ctx, fmt.Sprintf("9-catalog-instance-kill/%s/%s", engine, strategy),
		"kill -9 of one instance mid-load, then a restart", engine, strategy, nil)
	if err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	if err := r.loadOnCatalog(ctx, newCatalog("s9k", e.catalogSize()), catalogSpec(e.catalogRate(), d), d, 0.7); err != nil {
		return r.abort(err)
	}
	victim := r.cluster.Instances[0]
	pause(ctx, d*3/10)
	t0 := r.event("kill -9 instance 0 (pid %d)", victim.p.pid())
	if err := victim.Kill(); err != nil {
		return r.abort(err)
	}
	t1 := r.load.now()
	pause(ctx, d/6)
	t2 := r.event("restart instance 0")
	if err := victim.Restart(ctx); err != nil {
		return r.abort(err)
	}
	t3 := r.event("instance 0 ready")
	stopped := r.loadUntil(ctx, d, t3, e.afterFaultLoad())
	r.afterLoad = func(orders []*order) {
		n := inFlight(orders, victim.Index, t0, t1)
		r.inFlightBound = &n
		r.res.Figures.RecoverySeconds = recovery(orders, t2, victim.Index)
		r.res.Catalog.AfterFault = afterFault(orders, t0, t3, stopped, "the restarted instance is ready", nil)
		if r.res.Figures.RecoverySeconds == nil {
			r.warn("the restarted instance never answered 201")
		}
	}
	return r.finish(ctx, phaseMark{"before the kill", 0}, phaseMark{"instance 0 down", t0}, phaseMark{"after the restart", t2})
}

// filterOrders returns the orders of the SKUs in skus.
func filterOrders(orders []*order, skus map[string]bool) []*order {
	var out []*order
	for _, o := range orders {
		if skus[o.sku] {
			out = append(out, o)
		}
	}
	return out
}

func orNever(s *float64) string {
	if s == nil {
		return "never"
	}
	return fmt.Sprintf("%.2fs", *s)
}

// CatalogStrategies are the strategies of the database crash and the
// instance kill with a catalog: the reservation, the batched writer and
// one SQL row strategy.
var CatalogStrategies = []string{strategies.NameRedisReserve, strategies.NameBatched, strategies.NameConditional}
