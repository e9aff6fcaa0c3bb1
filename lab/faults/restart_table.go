package faults

import (
	"context"
	"fmt"
	"time"
)

// RestartTableSizes are the catalog sizes of the restart table (scenario
// 10); the short form runs the first two.
var RestartTableSizes = []int{200, 2000, 10000}

// restartPace is the restart table's pace: one order every 0.3 s, as the
// user who first measured it ordered.
const restartPace = 300 * time.Millisecond

// RestartTable is scenario 10, one row of the restart table: the
// measurement of a user reproduced. skus SKUs are put on sale on one
// instance whose Redis is durable (appendonly yes, appendfsync always);
// one order is answered 201; the Redis is killed (SIGKILL) and started
// again from its append-only file; then one order every 0.3 s for the SKU
// ordered before, until one is answered 201 (at most 60 s, 200 orders);
// then 10 more, each for a SKU drawn from the rest of the catalog, not
// ordered since the restart. The row is the time from the restart to the
// first 201 (and from the restarted Redis answering: it loads its file
// first, longer the larger the catalog; the service is expected to sell
// within a second of that), and how the other SKUs' first orders were
// answered; every SKU is audited, as in every run.
//
// Before each SKU's sale was checked on its own as it is ordered, the
// first order after a restart checked every SKU on sale: the user
// measured a first 201 0.53 s after the restart with 200 SKUs, 2.73 s with
// 1,000, and 503s for 30 to 60 s with 2,000 to 10,000.
func (e *Env) RestartTable(ctx context.Context, strategy string, skus int) Result {
	cfg := Config{Engine: "postgres", Strategy: strategy, Safe: true, Instances: 1, OrderTimeout: "3s"}
	r := e.newRun(10, fmt.Sprintf("10-restart-table/%s/%d-skus", strategy, skus),
		fmt.Sprintf("%d SKUs on sale on one instance, its durable Redis killed and restarted from its append-only file, one order every 0.3s", skus), cfg)
	rEnv, err := r.startReservationRedis()
	if err != nil {
		return r.abort(err)
	}
	if err := r.setUp(ctx, 0, rEnv); err != nil {
		return r.abort(err)
	}
	cat := newCatalog("s10", skus)
	stock := map[string]int64{}
	for _, sku := range cat.skus {
		stock[sku] = 100
	}
	r.res.Config.StockPerSKU = 100
	took, retries, err := r.startCatalog(ctx, stock)
	if err != nil {
		return r.abort(err)
	}
	r.cat = cat
	r.res.Catalog = &CatalogFigures{SKUs: skus, SetupSeconds: seconds(took), SetupWorkers: adminWorkers,
		SetupPerSecond: float64(skus) / took.Seconds(), SetupRetries: retries, MinStock: 100, MaxStock: 100}
	row := &RestartRow{Strategy: strategy, SKUs: skus, SetupSeconds: seconds(took)}
	r.res.Restart = row
	r.env.logf("  %d SKUs put on sale in %.1fs (%d at a time)", skus, took.Seconds(), adminWorkers)

	// One client, one order every 0.3 s, each within 5 s; at most 90 s and
	// 300 orders in all.
	spec := loadSpec{workers: 1, rate: float64(time.Second) / float64(restartPace), duration: 90 * time.Second,
		maxOrders: 300, timeout: 5 * time.Second}
	ordered := cat.skus[0]
	r.startLoad(ctx, []string{ordered}, spec)
	if !waitUntil(ctx, 10*time.Second, func() bool { return r.load.created.Load() >= 1 }) {
		return r.abort(fmt.Errorf("no order of %s was answered 201 within 10s, before any fault", ordered))
	}
	node := r.redis[len(r.redis)-1]
	tk := r.event("an order of %s answered 201; kill -9 the Redis", ordered)
	node.kill()
	row.AOFBytes = node.aofBytes()
	tr := r.event("restart the Redis with its append-only file (%d bytes)", row.AOFBytes)
	if err := node.restartDurable(); err != nil {
		return r.abort(err)
	}
	tu := r.event("the Redis answers")
	row.ReadyS = seconds(tu - tr)
	created := r.load.created.Load()
	if waitUntil(ctx, 60*time.Second, func() bool { return r.load.created.Load() > created }) {
		r.event("an order of %s answered 201 again", ordered)
	} else {
		r.event("no order of %s answered 201 within 60s of the restart", ordered)
	}
	// The rest of the catalog: each order now is for a SKU nobody has
	// ordered since the restart.
	to := r.event("order 10 SKUs drawn from the rest of the catalog, one every 0.3s")
	r.load.SetSKUs(cat.skus[1:])
	sent := r.load.seq.Load()
	waitUntil(ctx, 10*time.Second, func() bool { return r.load.seq.Load() >= sent+10 })
	r.load.stop()
	stopped := r.load.now()
	r.res.Config.LoadSeconds = stopped.Seconds()

	r.afterLoad = func(orders []*order) {
		rec := recovery(orders, tr, -1)
		r.res.Figures.RecoverySeconds, row.FirstCreatedS = rec, rec
		row.FirstCreatedAfterReadyS = recovery(orders, tu, -1)
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.call >= tr && (a.answer == ansBusy || a.answer == ansUnavailable || a.answer == ansMayExist) &&
					(rec == nil || a.ret <= tr+time.Duration(*rec*float64(time.Second))) {
					row.Refused503++
				}
			}
		}
		others := map[string]bool{}
		for _, sku := range cat.skus[1:] {
			others[sku] = true
		}
		af := afterFault(orders, tk, to, stopped, "orders of other SKUs begin", others)
		r.res.Catalog.AfterFault = af
		row.OtherSKUs, row.OtherAnswered = af.SKUsOrdered, af.SKUsOrdered-af.SKUsFirstRefused
		row.OtherSlowestS, row.OtherSlowestSKU = af.SlowestFirstAnswerS, af.SlowestSKU
		switch after := row.FirstCreatedAfterReadyS; {
		case after == nil:
			r.warn("no 201 within 60s of the Redis restart")
		case *after > 1:
			r.warn("the first 201 came %.2fs after the restarted Redis answered, over the 1s expected", *after)
		}
		if af.SKUsFirstRefused > 0 {
			r.warn("%d of the %d other SKUs ordered were refused at their first order (%s: %s)",
				af.SKUsFirstRefused, af.SKUsOrdered, af.RefusedSKU, af.RefusedAnswer)
		}
		r.note("Redis took %.2fs to load its append-only file (%d bytes) and answer; the first 201 came %s after that, %s after the restart began, "+
			"after %d 503s; the first orders of %d other SKUs were answered 201 or 409 in at most %.3fs",
			row.ReadyS, row.AOFBytes, orNever(row.FirstCreatedAfterReadyS), orNever(rec), row.Refused503, row.OtherAnswered, row.OtherSlowestS)
	}
	r.afterRows = func([]*order, []orderRow) { r.countChecks(ctx) }
	return r.finish(ctx, phaseMark{"before the kill", 0}, phaseMark{"after the restart", tr})
}
