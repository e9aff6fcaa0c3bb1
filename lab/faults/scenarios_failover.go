package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/testproxy"
	"github.com/flashsale/stock/lab/testredis"
)

// RedisFailover is scenario 14: a reservation strategy on a Redis primary
// with two replicas and three Sentinels (REDIS_MODE=sentinel), three
// instances under load. Mid-load the replicas' links to the primary
// freeze (they lag), the primary is killed (kill -9), and what the links
// held is dropped with it: the Sentinels promote a replica that lacks the
// primary's last writes. With RESERVE_WAIT_REPLICAS=1 (the default under
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
	old, err := rep.Master(ctx)
	if err != nil {
		return r.abort(err)
	}
	failedOver, stopWatch, err := rep.Watch(old)
	if err != nil {
		return r.abort(err)
	}
	defer stopWatch()
	tl := r.event("freeze the replicas' links to the primary (they lag)")
	links.Freeze()
	pause(ctx, e.scale(time.Second, 500*time.Millisecond))
	tk := r.event("kill -9 the Redis primary; drop what the links held")
	if control {
		// Without WAIT the promoted replica may have lost orders, and its
		// check may close the sale: the run audits the database alone.
		r.redisLostAt = &tk
	}
	old.Stop()
	links.Cut()
	links.Thaw()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	promoted, err := failedOver(wctx)
	cancel()
	if err != nil {
		return r.abort(fmt.Errorf("the Sentinels did not promote a replica: %w", err))
	}
	tp := r.event("Sentinel promoted %s", promoted.Addr)
	r.afterLoad = func(orders []*order) {
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
		// the promoted replica, whose check then closes the sale.
		r.afterRows = func(orders []*order, _ []orderRow) {
			lost := 0
			if n := r.res.Figures.LostWithRedisData; n != nil {
				lost = *n
			}
			if lost > 0 {
				r.fail("the control lost %d orders answered 201 with the primary", lost)
			}
			if r.res.Figures.RecoverySeconds == nil {
				r.fail("the control never sold again after the failover: the database is ahead of the promoted replica, and the sale stays closed")
			}
		}
	}
	res := r.finish(ctx, phaseMark{"replicated", 0}, phaseMark{"replicas lag", tl}, phaseMark{"primary gone", tk}, phaseMark{"replica promoted", tp})
	if control && len(res.Failures) == 0 && res.Verdict != VerdictError && res.Verdict != VerdictSkipped {
		// The control demonstrates the checks: it must be caught.
		res.Failures = append(res.Failures, "the control was not caught: nothing answered 201 was lost, and the sale sold on, with RESERVE_WAIT_REPLICAS=0")
		res.Verdict = VerdictFailed
		res.Line = res.verdictLine()
		e.logf("%s", res.Line)
	}
	return res
}

// startReplicatedRedis starts the run's Redis primary, its two replicas
// (each replicating through a proxy the run can freeze) and three
// Sentinels.
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
