package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testproxy"
	"github.com/flashsale/stock/lab/testredis"
)

// RedisFailover is scenario 14: a reservation strategy on a Redis primary
// with two replicas and three Sentinels (REDIS_MODE=sentinel), three
// instances under load. Mid-load the link of the replica the Sentinels
// prefer (replica-priority) freezes (it lags; the other keeps up), the
// primary is killed (kill -9), and what the link held is dropped with it:
// the Sentinels promote the replica that lacks the primary's last writes,
// although the other has them (WAIT for one replica of two would have
// answered them 201). With RESERVE_WAIT_REPLICAS=1 (the default under
// Sentinel) the orders taken during the lag were answered 503 (may have
// happened), never 201, and the consumers wrote none of them: nothing
// answered 201 is lost, and the sale sells on after the failover. The
// control, RESERVE_WAIT_REPLICAS=0, answered them 201 and loses them (or,
// had a consumer written them first, finds the database ahead of the
// promoted replica and closes the sale): it must be caught.
func (e *Env) RedisFailover(ctx context.Context, strategy string, control bool) Result {
	d, rate := e.scale(16*time.Second, 8*time.Second), e.scaleRate(400, 200)
	wait, name, title := "1", "14-redis-failover/postgres/"+strategy, "the Redis primary of "+strategy+" killed while its replicas lag; Sentinel promotes one"
	if control {
		wait, name = "0", name+"/no-wait"
		title = "control: " + title + ", with RESERVE_WAIT_REPLICAS=0 — the orders answered 201 during the lag must be found lost"
	}
	r := e.newRun(14, name, title, Config{Engine: "postgres", Strategy: strategy, Safe: !control, Instances: 3, OrderTimeout: "3s"})
	rep, links, err := r.startReplicatedRedis()
	if err != nil {
		return r.abort(err)
	}
	if err := r.setUp(ctx, 0, "REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(rep.Addrs(), ","),
		"REDIS_SENTINEL_MASTER="+testredis.MasterName, "RESERVE_WAIT_REPLICAS="+wait, "RESERVE_CLAIM_IDLE=1s"); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s14", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.7)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))
	pause(ctx, d/4)
	tl := r.event("freeze the link of the replica the Sentinels prefer (it lags; the other keeps up)")
	links[len(links)-1].Freeze()
	pause(ctx, e.scale(time.Second, 500*time.Millisecond))
	tk, promoted, err := r.killPrimary(ctx, rep, links, "kill -9 the Redis primary; drop what the links held", func(tk *time.Duration) {
		if control {
			// Without WAIT the promoted replica may have lost orders, and
			// its check may close the sale: the run audits the database
			// alone.
			r.redisLostAt = tk
		}
	})
	if err != nil {
		return r.abort(err)
	}
	tp := r.event("Sentinel promoted %s", promoted.Addr)
	if lagging := rep.Servers[len(rep.Servers)-1]; promoted != lagging {
		// The other replica had every write: the run would show nothing.
		r.warn("the Sentinels promoted %s, not the lagging replica they prefer (%s): this run did not test a promotion that lacks writes", promoted.Addr, lagging.Addr)
	}
	var lost, closed int
	r.afterLoad = func(orders []*order) {
		// Every SKU sells again (or answers sold out) after the promotion:
		// a sale closed by its check (the database ahead of the promoted
		// replica) fails the safe run, and catches the control.
		for _, sku := range skus {
			if !answeredAfter(orders, sku, tp) {
				closed++
				r.fail("%s never sold again after the promotion: its sale stays closed", sku)
			}
		}
		lag := figures(orders, tl, tk)
		r.note("during the lag: %d requests, %d answered 201, %d 503 (%d may have happened)", lag.Requests, lag.Created, lag.Responses503, lag.MayExist)
		r.res.Figures.RecoverySeconds = recovery(orders, tk, -1)
		gone := figures(orders, tk, r.load.now())
		r.note("from the kill: %d answered 503; the promotion took %.2fs (down-after %s)", gone.Responses503, (tp - tk).Seconds(), rep.DownAfter)
		// Selling again within 2x down-after plus the election: the
		// promotion is down-after plus the election.
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec > (tp-tk+rep.DownAfter).Seconds() {
			r.warn("no sale within the promotion (%.2fs) plus down-after (%s) of the kill", (tp - tk).Seconds(), rep.DownAfter)
		}
		if !control && lag.Created > 0 {
			r.note("%d orders answered 201 during the lag: their replicas confirmed them before the links froze", lag.Created)
		}
	}
	if control {
		// What the control does, caught one way or the other: the orders
		// answered 201 during the lag and not yet written are lost with
		// the primary; those a consumer wrote put the database ahead of
		// the promoted replica, whose check then closes the sale (failed
		// in afterLoad).
		r.afterRows = func(orders []*order, _ []orderRow) {
			if n := r.res.Figures.LostWithRedisData; n != nil {
				lost = *n
			}
			if lost > 0 {
				r.fail("the control lost %d orders answered 201 with the primary", lost)
			}
		}
	}
	res := r.finish(ctx, phaseMark{"replicated", 0}, phaseMark{"replicas lag", tl}, phaseMark{"primary gone", tk}, phaseMark{"replica promoted", tp})
	if control && lost == 0 && closed == 0 && res.Verdict != VerdictError && res.Verdict != VerdictSkipped {
		// The control demonstrates the checks: it must be caught by
		// them, a loss or a closed sale, not by another failure.
		res.Failures = append(res.Failures, "the control was not caught: nothing answered 201 was lost, and the sale sold on, with RESERVE_WAIT_REPLICAS=0")
		res.Verdict = VerdictFailed
		res.Line = res.verdictLine()
		e.logf("%s", res.Line)
	}
	return res
}

// killPrimary kills the Redis primary (kill -9) as the event what, drops
// what the links held with it, and returns once the Sentinels have
// promoted a replica: the kill's time on the load's clock and the replica.
// atKill, when set, is called with the kill's time before the kill.
func (r *run) killPrimary(ctx context.Context, rep *testredis.Replicated, links testproxy.Group, what string, atKill func(*time.Duration)) (time.Duration, *testredis.Server, error) {
	old, err := rep.Master(ctx)
	if err != nil {
		return 0, nil, err
	}
	failedOver, stopWatch, err := rep.Watch(old)
	if err != nil {
		return 0, nil, err
	}
	defer stopWatch()
	tk := r.event("%s", what)
	if atKill != nil {
		atKill(&tk)
	}
	old.Stop()
	links.Cut()
	links.Thaw()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	promoted, err := failedOver(wctx)
	if err != nil {
		return 0, nil, fmt.Errorf("the Sentinels did not promote a replica: %w", err)
	}
	return tk, promoted, nil
}

// answeredAfter reports whether an order of sku called at or after at was
// answered 201 or 409: its sale answers.
func answeredAfter(orders []*order, sku string, at time.Duration) bool {
	for _, o := range orders {
		if o.sku != sku {
			continue
		}
		for _, a := range o.attempts {
			if a.call >= at && (a.answer == ansCreated || a.answer == ansSoldOut) {
				return true
			}
		}
	}
	return false
}

// startReplicatedRedis starts the run's Redis primary, its two replicas
// (each replicating through a proxy the run can freeze; the Sentinels
// prefer the second, by its replica-priority) and three Sentinels.
func (r *run) startReplicatedRedis() (*testredis.Replicated, testproxy.Group, error) {
	var links testproxy.Group
	closeLinks := func() {
		for _, p := range links {
			p.Close()
		}
	}
	rep, err := testredis.SpawnReplicated(r.dir, testredis.SentinelOptions{
		Link: func(primary string) (string, error) {
			p, err := testproxy.Listen(primary)
			if err != nil {
				return "", err
			}
			links = append(links, p)
			return p.Addr, nil
		},
		// The Sentinels leave a replica on its proxy this long.
		FailoverTimeout: 5 * time.Minute,
		LogDir:          r.dir,
		// A lower priority is preferred: the second replica.
		ReplicaArgs: [][]string{{"--replica-priority", "200"}, {"--replica-priority", "50"}},
	})
	if err != nil {
		closeLinks()
		if errors.Is(err, testredis.ErrNoRedis) {
			return nil, nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		return nil, nil, err
	}
	r.cleanups = append(r.cleanups, func() { rep.Stop(); closeLinks() })
	return rep, links, nil
}

// LockFailover is scenario 14's lock run: redis-lock on a Redis primary
// with two replicas and three Sentinels (REDIS_MODE=sentinel), LOCK_TTL
// 5 s. The replicas lag from the start (their links frozen), so nothing of
// the locks reaches them. Instance 0 runs with FREEZE_HOLDER: its first
// order stops its own process while it holds the SKU's lock, between its
// read and its write. Then the primary is killed and the Sentinels
// promote a replica without the lock's key: the other instances take the
// lock at once, long before its TTL, and sell the rest. Then instance 0
// continues and writes what it read. With FENCING=on that write is
// refused (its read is stale), and the stock stays exact; FENCING=off is
// the control, which must oversell.
func (e *Env) LockFailover(ctx context.Context, fencing string) Result {
	strategy := strategies.NameRedisLock
	ttl := 5 * time.Second
	r := e.newRun(14, "14-lock-failover/postgres/"+strategy+"/fencing-"+fencing,
		"a lock holder frozen while the Redis primary behind Sentinel is lost: the promoted replica hands its lock to another instance", Config{
			Engine: "postgres", Strategy: strategy, Safe: fencing == "on", Instances: 3, Fencing: fencing,
			LockTTL: ttl.String(), OrderTimeout: "5s", StockPerSKU: 300})
	rep, links, err := r.startReplicatedRedis()
	if err != nil {
		return r.abort(err)
	}
	links.Freeze()
	r.instanceEnv = map[int][]string{0: {"FREEZE_HOLDER=true"}}
	if err := r.setUp(ctx, 0, "REDIS_MODE=sentinel", "REDIS_ADDRS="+strings.Join(rep.Addrs(), ","),
		"REDIS_SENTINEL_MASTER="+testredis.MasterName, "FENCING="+fencing, "LOCK_TTL="+ttl.String(), "LOCK_WAIT=3s"); err != nil {
		return r.abort(err)
	}
	victim := r.cluster.Instances[0]
	sku := "s14-lock"
	stock := r.res.Config.StockPerSKU
	if err := r.startSales(ctx, []string{sku}, stock); err != nil {
		return r.abort(err)
	}
	// As scenario 2: instance 0 takes half the requests, and a stopped
	// instance holds at most a quarter of the workers.
	r.startLoad(ctx, []string{sku}, loadSpec{workers: 200, rate: 200, duration: time.Minute, maxOrders: 1 << 30,
		timeout: 10 * time.Second, weights: []int{2, 1, 1}, perInstance: 50})
	if !waitUntil(ctx, 10*time.Second, victim.Stopped) {
		return r.abort(fmt.Errorf("instance 0 did not freeze itself"))
	}
	tf := r.event("instance 0 froze itself holding the lock of %s, between its read and its write (FREEZE_HOLDER)", sku)
	tk, promoted, err := r.killPrimary(ctx, rep, links, "kill -9 the Redis primary; its replicas never had the lock", nil)
	if err != nil {
		return r.abort(err)
	}
	r.event("Sentinel promoted %s", promoted.Addr)
	// Until nothing is left: the frozen holder's write, of 1 to 3 units,
	// then finds fewer than it takes whatever its quantity, so the control
	// oversells every time (with 2 left, a write of 2 would not).
	if !waitUntil(ctx, 15*time.Second, func() bool {
		a, err := r.cluster.Audit(ctx, sku)
		return err == nil && a.Available == 0
	}) {
		r.warn("the other instances did not sell the rest of %s within 15s of the failover", sku)
	}
	tc := r.event("SIGCONT instance 0, stopped %.1fs (LOCK_TTL %s)", seconds(r.load.now()-tf), ttl)
	if err := victim.Resume(); err != nil {
		return r.abort(err)
	}
	pause(ctx, 1500*time.Millisecond)
	r.load.stop()
	r.afterLoad = func(orders []*order) {
		// The others sold again after the failover, before the lock's TTL
		// would have let them: the failover handed the lock over.
		first := time.Duration(-1)
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansCreated && a.instance != victim.Index && a.call >= tk && (first < 0 || a.ret < first) {
					first = a.ret
				}
			}
		}
		if first < 0 {
			r.warn("no other instance sold after the failover")
			return
		}
		s := seconds(first - tk)
		r.res.Figures.RecoverySeconds = &s
		r.note("the other instances sold again %.2fs after the kill, %.2fs after instance 0 froze holding a lock of %s", s, seconds(first-tf), ttl)
		if first-tf >= ttl {
			// The lock's expiry may have handed it over, not the failover.
			r.warn("the others sold again only %.2fs after instance 0 froze, past the lock's TTL (%s): the failover's hand-over was not shown", seconds(first-tf), ttl)
		}
	}
	res := r.finish(ctx, phaseMark{"instance 0 holds the lock", 0}, phaseMark{"frozen", tf}, phaseMark{"primary gone", tk}, phaseMark{"instance 0 continues", tc})
	if fencing == "off" && res.Figures.OversoldUnits == 0 && res.Verdict != VerdictError && res.Verdict != VerdictSkipped {
		res.Failures = append(res.Failures, "the control was not caught: FENCING=off did not oversell when the failover handed the lock over")
		res.Verdict = VerdictFailed
		res.Line = res.verdictLine()
		e.logf("%s", res.Line)
	}
	return res
}
