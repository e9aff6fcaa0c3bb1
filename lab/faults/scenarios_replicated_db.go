package faults

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/lab/testgalera"
	"github.com/flashsale/stock/lab/testpatroni"
)

// The replicated databases of issue 39 (docs/replicated.md): PostgreSQL
// under Patroni (scenario 15) and a MariaDB Galera cluster (scenario 16),
// each with three instances under load and every order audited.

// How a run of scenario 15 loses its primary.
const (
	PrimaryKilled = "kill"   // kill -9 of Patroni and PostgreSQL
	PrimaryFrozen = "freeze" // SIGSTOP past the leader key's ttl, then SIGCONT: a deposed primary wakes
	AsyncLagging  = "async"  // the control: asynchronous replication, the standby lagging, then the kill
)

// patroniTTL is Patroni's ttl in lab/testpatroni: the leader key lasts
// this long after its holder stops renewing it. The goal: selling
// again within twice that.
const patroniTTL = 10 * time.Second

// PatroniFailover is scenario 15: strategy (one that needs no server
// besides the database) on PostgreSQL under Patroni
// (two members, synchronous_mode), three instances reaching the primary
// through a multi-host DATABASE_URL (target_session_attrs=read-write),
// under load. Mid-load the primary is lost (how): killed, or frozen past
// the ttl and woken as a deposed primary. Every order answered 201 must be
// on the promoted standby, and no order answered "not taken" may be
// there. The control (AsyncLagging) runs with asynchronous replication and
// the standby's replication frozen before the kill: the orders answered
// 201 meanwhile are lost with the primary, and must be caught.
func (e *Env) PatroniFailover(ctx context.Context, strategy, how string) Result {
	d, rate := e.scale(36*time.Second, 24*time.Second), e.scaleRate(300, 150)
	name := fmt.Sprintf("15-patroni-%s/postgres/%s", how, strategy)
	titles := map[string]string{
		PrimaryKilled: "the PostgreSQL primary under Patroni killed (kill -9) mid-load; Patroni promotes the synchronous standby",
		PrimaryFrozen: "the PostgreSQL primary under Patroni frozen (SIGSTOP) past the leader's ttl, then woken as a deposed primary",
		AsyncLagging:  "control: asynchronous replication, the standby lagging when the primary is killed — the orders answered 201 meanwhile must be found lost",
	}
	control := how == AsyncLagging
	r := e.newRun(15, name, titles[how], Config{Engine: "postgres", Strategy: strategy, Safe: !control, Instances: 3, OrderTimeout: "3s"})
	c, err := testpatroni.Spawn(r.dir, testpatroni.Options{Async: control, LogDir: r.dir})
	if err != nil {
		if errors.Is(err, testpatroni.ErrNoPatroni) {
			return r.abort(fmt.Errorf("%w: %w", ErrMissing, err))
		}
		return r.abort(err)
	}
	r.cleanups = append(r.cleanups, c.Stop)
	if r.dbURL, err = c.CreateDatabase(ctx, "faults_"+randomHex(4)); err != nil {
		return r.abort(err)
	}
	primary, err := c.Primary(ctx)
	if err != nil {
		return r.abort(err)
	}
	standby := otherMember(c, primary)
	if err := r.setUp(ctx, 0); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s15", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))
	pause(ctx, d/5)
	var tk time.Duration
	switch how {
	case PrimaryKilled, AsyncLagging:
		if control {
			r.event("freeze the replication to the standby %s (it lags)", standby.Name)
			if err := standby.FreezeReplication(ctx); err != nil {
				return r.abort(err)
			}
			pause(ctx, 500*time.Millisecond)
		}
		if err := primary.Kill(); err != nil {
			return r.abort(err)
		}
		// On the load's clock once every process is gone: recovery counts
		// requests sent after it.
		tk = r.event("kill -9 the primary %s (Patroni and PostgreSQL)", primary.Name)
		standby.ThawReplication()
	case PrimaryFrozen:
		if err := primary.Freeze(); err != nil {
			return r.abort(err)
		}
		tk = r.event("SIGSTOP the primary %s (Patroni and PostgreSQL)", primary.Name)
	}
	tp, err := r.waitPromoted(ctx, c, primary)
	if err != nil {
		return r.abort(err)
	}
	if how == PrimaryFrozen {
		pause(ctx, time.Second)
		r.event("SIGCONT the old primary %s: it wakes deposed", primary.Name)
		primary.Thaw()
	}
	r.afterLoad = func(orders []*order) {
		r.res.Figures.RecoverySeconds = recovery(orders, tk, -1)
		gone := figures(orders, tk, tp)
		r.note("from the loss of the primary to the promotion (%.2fs): %d requests, %d answered 503 (%d may have happened)",
			(tp - tk).Seconds(), gone.Requests, gone.Responses503, gone.MayExist)
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec > (2*patroniTTL).Seconds() {
			r.warn("no order answered 201 within 2x Patroni's ttl (%s) of the primary's loss", 2*patroniTTL)
		}
	}
	lost := 0
	r.afterRows = func([]*order, []orderRow) {
		for _, f := range r.perSKU {
			lost += f.Lost
		}
	}
	res := r.finish(ctx, phaseMark{"primary", 0}, phaseMark{"primary lost", tk}, phaseMark{"standby promoted", tp})
	return controlCaught(e, res, control && lost == 0, "asynchronous replication lost no order answered 201")
}

// waitPromoted returns, on the load's clock, when a member other than old
// leads the cluster.
func (r *run) waitPromoted(ctx context.Context, c *testpatroni.Cluster, old *testpatroni.Member) (time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, 4*patroniTTL)
	defer cancel()
	var promoted *testpatroni.Member
	if !waitUntil(wctx, 4*patroniTTL, func() bool {
		m, err := c.Primary(wctx)
		promoted = m
		return err == nil && m != old
	}) {
		return 0, fmt.Errorf("no standby promoted by Patroni within %s", 4*patroniTTL)
	}
	return r.event("Patroni promoted %s", promoted.Name), nil
}

// otherMember is c's member that is not m (c has two).
func otherMember(c *testpatroni.Cluster, m *testpatroni.Member) *testpatroni.Member {
	for _, o := range c.Members {
		if o != m {
			return o
		}
	}
	return nil
}

// GaleraNodeKill is scenario 16: strategy (one that needs no server
// besides the database) on a MariaDB Galera cluster of
// three nodes, three instances each writing through its own node first
// (DATABASE_URL names every node, its own first), under load. Mid-load
// node 0 is killed (kill -9); instance 0 moves to the next node; later the
// node is restarted and rejoins by state transfer. Every order answered
// 201 must be in the database, nothing oversold, and the sale goes on.
func (e *Env) GaleraNodeKill(ctx context.Context, strategy string) Result {
	d, rate := e.scale(30*time.Second, 16*time.Second), e.scaleRate(300, 150)
	r := e.newRun(16, "16-galera-node-kill/mysql/"+strategy,
		"one node of a three-node Galera cluster killed (kill -9) mid-load, then restarted (it rejoins by state transfer)",
		Config{Engine: "mysql", Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
	c, err := testgalera.Spawn(r.dir, testgalera.Options{LogDir: r.dir})
	if err != nil {
		if errors.Is(err, testgalera.ErrNoGalera) {
			return r.abort(fmt.Errorf("%w: %w", ErrMissing, err))
		}
		return r.abort(err)
	}
	r.cleanups = append(r.cleanups, c.Stop)
	db := "faults_" + randomHex(4)
	if err := c.CreateDatabase(ctx, 2, db); err != nil {
		return r.abort(err)
	}
	// Instance i writes through node i first; the run's own audits go
	// through the node that stays up first.
	r.dbURL = c.URLFrom(2, db)
	r.instanceEnv = map[int][]string{}
	for i := range 3 {
		r.instanceEnv[i] = []string{"DATABASE_URL=" + c.URLFrom(i, db)}
	}
	if err := r.setUp(ctx, 0); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s16", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))
	pause(ctx, d/4)
	if err := c.Nodes[0].Kill(); err != nil {
		return r.abort(err)
	}
	// Once the node is gone: recovery counts requests sent after it.
	tk := r.event("kill -9 Galera node 0 (instance 0's first node)")
	pause(ctx, d/4)
	tr := r.event("restart node 0: it rejoins by state transfer")
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = c.Nodes[0].Restart(rctx)
	cancel()
	if err != nil {
		return r.abort(err)
	}
	tj := r.event("node 0 synced again")
	r.afterLoad = func(orders []*order) {
		r.res.Figures.RecoverySeconds = recovery(orders, tk, 0)
		gone := figures(orders, tk, tr)
		r.note("from the kill to the restart: %d requests, %d answered 201, %d answered 503 (%d may have happened)",
			gone.Requests, gone.Created, gone.Responses503, gone.MayExist)
		for i := range 3 {
			if rec := recovery(orders, tk, i); rec != nil {
				r.note("instance %d sold again %.2fs after the kill", i, *rec)
			} else {
				r.warn("instance %d sold nothing after the kill", i)
			}
		}
	}
	return r.finish(ctx, phaseMark{"three nodes", 0}, phaseMark{"node 0 killed", tk}, phaseMark{"node 0 rejoining", tr}, phaseMark{"three nodes again", tj})
}

// controlCaught fails a control run that its checks did not catch by what
// it demonstrates (uncaught): a control that loses nothing shows nothing,
// whatever else failed.
func controlCaught(e *Env, res Result, uncaught bool, what string) Result {
	if uncaught && res.Verdict != VerdictError && res.Verdict != VerdictSkipped {
		res.Failures = append(res.Failures, "the control was not caught: "+what)
		res.Verdict = VerdictFailed
		res.Line = res.verdictLine()
		e.logf("%s", res.Line)
	}
	return res
}
