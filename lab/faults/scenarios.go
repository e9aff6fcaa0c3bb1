package faults

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// scale picks the full or the short value.
func (e *Env) scale(full, short time.Duration) time.Duration {
	if e.Short {
		return short
	}
	return full
}

func skuNames(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("%s-%c", prefix, 'a'+i)
	}
	return s
}

// stockFor sizes each SKU's stock so that a load of rate orders per second
// (two units each on average) over d would take frac of it: the sale should
// end after the fault, late in the load, so that the end of the stock is
// tested too.
func stockFor(rate float64, d time.Duration, skus int, frac float64) int64 {
	return int64(rate * d.Seconds() * 2 * frac / float64(skus))
}

// sqlSpec is the load of the scenarios on SQL strategies.
func sqlSpec(rate float64, d time.Duration) loadSpec {
	return loadSpec{workers: 64, rate: rate, duration: d, maxOrders: int(rate * d.Seconds() * 2), timeout: 5 * time.Second}
}

// KillRestart is scenario 1: kill -9 of one of three instances mid-load,
// then a restart. Every 201 a client saw must be an order row, the rows
// whose answer was lost at most the requests in flight at the kill, the
// stock conserved and each SKU's history linearizable.
//
// With the batched strategy the instance is killed mid-batch: the load is
// heavier (many buyers at once on two SKUs, so that batches form), and the
// instance is stopped (SIGSTOP) until the database shows one of its batch
// transactions open with its writes done, then killed; the order rows are
// then checked batch by batch (checkBatches).
func (e *Env) KillRestart(ctx context.Context, engine, strategy string) Result {
	d, rate := e.scale(16*time.Second, 6*time.Second), 500.0
	if e.Short {
		rate = 200
	}
	info, _ := strategies.Lookup(strategy)
	batched := info.Family == strategies.FamilyBatched
	spec := sqlSpec(rate, d)
	if batched {
		rate = e.scaleRate(1200, 600)
		spec = sqlSpec(rate, d)
		spec.workers = 192
	}
	title := "kill -9 of one instance mid-load, then a restart"
	if batched {
		title = "kill -9 of one instance mid-batch (stopped with a batch transaction open), then a restart"
	}
	cfg := Config{Engine: engine, Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"}
	var env []string
	switch lockOf(strategy) {
	case strategies.LockEtcd:
		cfg.EtcdMembers = 1
	case strategies.LockZooKeeper:
		cfg.ZKServers = 1
	}
	r := e.newRun(1, fmt.Sprintf("1-kill-restart/%s/%s", engine, strategy), title, cfg)
	if isCoordination(strategy) {
		// The killed instance's session (etcd lease, ZooKeeper session)
		// ends a LOCK_TTL after its last renewal: its keys or nodes, and
		// the locks they held, go with it.
		coEnv, err := r.startCoordinator(strategy)
		if err != nil {
			return r.abort(err)
		}
		env = append(env, coEnv, "LOCK_TTL=1s")
	}
	if lockOf(strategy) == strategies.LockTable {
		// The killed instance's lock rows run out a LOCK_TTL after their
		// last renewal: 1 s, as for the coordination services' sessions.
		env = append(env, "LOCK_TTL=1s")
	}
	if isReserved(strategy) {
		// The killed instance's consumer may hold a batch read and not
		// yet written: another instance claims it after a second.
		rEnv, err := r.startReservationRedis()
		if err != nil {
			return r.abort(err)
		}
		env = append(env, rEnv, "RESERVE_CLAIM_IDLE=1s")
	}
	if err := r.setUp(ctx, 0, env...); err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	skus := skuNames("s1", 2)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, spec)
	victim := r.cluster.Instances[0]

	pause(ctx, d*3/10)
	var caught []openTx
	t0 := r.load.now()
	if batched {
		open, stoppedAt, tries, err := catchMidBatch(ctx, victim, r.dbURL, r.load.now, d/3)
		if err != nil {
			return r.abort(err)
		}
		caught, t0 = open, stoppedAt
		r.event("SIGSTOP instance 0 (try %d): %d of its transactions open in the database, %d with writes done",
			tries, len(open), countFunc(open, func(t openTx) bool { return t.Wrote }))
	}
	r.event("kill -9 instance 0 (pid %d)", victim.p.pid())
	if err := victim.Kill(); err != nil {
		return r.abort(err)
	}
	t1 := r.load.now()
	pause(ctx, d/6)
	t2 := r.event("restart instance 0")
	if err := victim.Restart(ctx); err != nil {
		return r.abort(err)
	}
	r.event("instance 0 ready")
	r.afterLoad = func(orders []*order) {
		n := inFlight(orders, victim.Index, t0, t1)
		r.inFlightBound = &n
		r.res.Figures.RecoverySeconds = recovery(orders, t2, victim.Index)
		if r.res.Figures.RecoverySeconds == nil {
			r.warn("the restarted instance never answered 201")
		}
	}
	if batched {
		r.afterRows = func(orders []*order, rows []orderRow) {
			r.checkBatches(orders, rows, victim.Index, t0, t1, caught)
		}
	}
	return r.finish(ctx, phaseMark{"before the kill", 0}, phaseMark{"instance 0 down", t0}, phaseMark{"after the restart", t2})
}

// scaleRate picks the full or the short rate.
func (e *Env) scaleRate(full, short float64) float64 {
	if e.Short {
		return short
	}
	return full
}

func countFunc[T any](s []T, f func(T) bool) int {
	n := 0
	for _, v := range s {
		if f(v) {
			n++
		}
	}
	return n
}

// IdempotentRetries is scenario 6: clients send an Idempotency-Key, time out
// quickly and retry (on another instance) while instances are frozen and
// killed: each key must be at most one order.
func (e *Env) IdempotentRetries(ctx context.Context) Result {
	d, rate := e.scale(20*time.Second, 10*time.Second), 200.0
	r := e.newRun(6, "6-idempotent-retries/postgres/conditional", "clients time out and retry with their Idempotency-Key while instances are killed",
		Config{Engine: "postgres", Strategy: strategies.NameConditional, Safe: true, Instances: 3, OrderTimeout: "3s"})
	if err := r.setUp(ctx, 0); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s6", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.85)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	spec := sqlSpec(rate, d)
	spec.workers, spec.timeout, spec.idempotent, spec.attempts = 128, 400*time.Millisecond, true, 8
	r.startLoad(ctx, skus, spec)

	type kill struct {
		victim int
		t0, t1 time.Duration
	}
	var kills []kill
	var restarts []time.Duration
	pause(ctx, d/6)
	for i := 0; r.load.now() < d*3/4; i++ {
		victim := r.cluster.Instances[i%len(r.cluster.Instances)]
		if err := victim.Pause(); err != nil {
			return r.abort(err)
		}
		r.event("SIGSTOP instance %d: its clients time out and retry elsewhere", victim.Index)
		pause(ctx, time.Second)
		t0 := r.event("kill -9 instance %d", victim.Index)
		if err := victim.Kill(); err != nil {
			return r.abort(err)
		}
		kills = append(kills, kill{victim.Index, t0, r.load.now()})
		pause(ctx, time.Second)
		restarts = append(restarts, r.event("restart instance %d", victim.Index))
		if err := victim.Restart(ctx); err != nil {
			return r.abort(err)
		}
		pause(ctx, d/8)
	}
	r.afterLoad = func(orders []*order) {
		r.res.Figures.RecoverySeconds = recovery(orders, restarts[len(restarts)-1], kills[len(kills)-1].victim)
		retried := 0
		for _, o := range orders {
			if len(o.attempts) > 1 {
				retried++
			}
		}
		r.note("%d orders were retried with their key; %d instances killed", retried, len(kills))
		if retried == 0 {
			r.warn("no order was retried: the scenario did not test idempotency")
		}
	}
	return r.finish(ctx)
}
