package faults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// RedlockNodeLoss is scenario 3: redlock over five Redis servers loses two
// of them mid-load (it must keep selling), then a third (no majority: it
// must answer 503 and sell nothing without a lock), then the three come
// back empty (no double holder: the stock stays exact).
func (e *Env) RedlockNodeLoss(ctx context.Context) Result {
	d, rate := e.scale(24*time.Second, 10*time.Second), 150.0
	ttl := e.scale(2*time.Second, time.Second)
	r := e.newRun(3, "3-redlock-node-loss", "redlock: 2 of 5 Redis servers killed, then 3 of 5, then restarted empty",
		Config{Engine: "postgres", Strategy: strategies.NameRedlock, Safe: true, Instances: 3, RedisServers: 5,
			Fencing: "on", LockTTL: ttl.String(), OrderTimeout: "3s"})
	if err := r.setUp(ctx, 5, "FENCING=on", "LOCK_TTL="+ttl.String(), "LOCK_WAIT=2s"); err != nil {
		return r.abort(err)
	}
	skus := skuNames("s3", 4)
	r.res.Config.StockPerSKU = stockFor(rate, d, len(skus), 0.5)
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, skus, sqlSpec(rate, d))

	pause(ctx, d/5)
	t2 := r.event("kill -9 Redis servers 1 and 2 of 5")
	r.redis[0].kill()
	r.redis[1].kill()
	pause(ctx, d/4)
	t3 := r.event("kill -9 Redis server 3 of 5: no majority left")
	r.redis[2].kill()
	pause(ctx, d/4)
	tr := r.event("restart Redis servers 1, 2, 3 empty")
	for _, n := range r.redis[:3] {
		if err := n.restartEmpty(); err != nil {
			return r.abort(err)
		}
	}
	r.afterLoad = func(orders []*order) {
		two := figures(orders, t2, t3)
		if two.Created == 0 {
			r.warn("no order was sold while 3 of 5 Redis servers were up")
		}
		three := figures(orders, t3, tr)
		if three.Responses503 == 0 {
			r.warn("no 503 while only 2 of 5 Redis servers were up")
		}
		// A lease taken before the majority was lost lives at most one
		// TTL: an order that started later and was answered before any
		// server came back cannot have had a lock.
		late := 0
		for _, o := range orders {
			for _, a := range o.attempts {
				if a.answer == ansCreated && a.call >= t3+ttl && a.ret < tr {
					late++
				}
			}
		}
		if late > 0 {
			r.fail("%d orders started over a TTL after the majority was lost were sold: a lock without a majority", late)
		}
		r.res.Figures.RecoverySeconds = recovery(orders, tr, -1)
		if rec := r.res.Figures.RecoverySeconds; rec == nil || *rec > 10 {
			r.warn("no sale within 10s of the Redis servers' restart")
		}
	}
	return r.finish(ctx, phaseMark{"5 of 5 up", 0}, phaseMark{"3 of 5 up", t2}, phaseMark{"2 of 5 up", t3}, phaseMark{"restarted empty", tr})
}

// RedlockDownRate is the availability half of scenario 3: redlock must
// not only stay safe with a minority of its five Redis servers down, it
// must keep selling at nearly its usual rate. Three instances take
// contended bursts (2,000 buyers at once for 500 units of one SKU; short
// form 600 for 150) with every server up, then with one and with two
// servers refusing connections (killed) and hung (SIGSTOP: connections
// are accepted, nothing is answered), each burst on a fresh SKU, the fault
// undone before the next (restarted empty, SIGCONT). A warm-up burst comes
// first, so that the all-up case does not pay for cold connection pools.
// A burst sells out in well under a second here, so one burst is a noisy
// measure: the cases run in three interleaved rounds (one in the short
// form), and a case's rate is its median round, as make demo does.
//
// Each case must sell at 0.7 times the all-up rate of the same run or
// more, answer under 1% of its buyers 503, and leave no order of unknown
// outcome; besides, every check of every run (audit, rows, history). In
// the short form, on a machine busy with the rest of the suite, a rate
// below 0.7 is a warning (degraded); 503s and unknown outcomes still fail
// it.
func (e *Env) RedlockDownRate(ctx context.Context) Result {
	buyers, workers, stock, rounds := 2000, 200, int64(500), 3
	if e.Short {
		buyers, workers, stock, rounds = 600, 100, 150, 1
	}
	r := e.newRun(3, "3-redlock-down-rate", "redlock: contended bursts with 1 and 2 of 5 Redis servers refusing connections or hung, against all up",
		Config{Engine: "postgres", Strategy: strategies.NameRedlock, Safe: true, Instances: 3, RedisServers: 5,
			Fencing: "on", LockTTL: "5s", OrderTimeout: "3s", StockPerSKU: stock})
	if err := r.setUp(ctx, 5, "FENCING=on", "LOCK_TTL=5s", "LOCK_WAIT=3s"); err != nil {
		return r.abort(err)
	}
	r.startLoad(ctx, nil, loadSpec{workers: workers, timeout: 10 * time.Second, burstsOnly: true})
	cases := []RateCase{
		{Name: "all up"},
		{Name: "1 refusing", Fault: "refusing", Down: 1},
		{Name: "1 hung", Fault: "hung", Down: 1},
		{Name: "2 refusing", Fault: "refusing", Down: 2},
		{Name: "2 hung", Fault: "hung", Down: 2},
	}
	// burst runs one burst of n buyers on a fresh SKU with c's fault, and
	// returns its span.
	burst := func(name string, c RateCase, n int) (from, to time.Duration, err error) {
		sku := fmt.Sprintf("s3r-%d", len(r.initial))
		if err := r.startSales(ctx, []string{sku}, stock); err != nil {
			return 0, 0, err
		}
		down := r.redis[:c.Down]
		for _, node := range down {
			switch c.Fault {
			case "refusing":
				node.kill()
			case "hung":
				if err := node.pause(); err != nil {
					return 0, 0, err
				}
			}
		}
		r.load.SetSKUs([]string{sku})
		r.event("burst %q: %d buyers for %d units of %s", name, n, stock, sku)
		from, to = r.load.burst(ctx, n, workers)
		r.event("burst %q answered", name)
		for _, node := range down {
			switch c.Fault {
			case "refusing":
				err = errors.Join(err, node.restartEmpty())
			case "hung":
				err = errors.Join(err, node.resume())
			}
		}
		return from, to, errors.Join(err, ctx.Err())
	}
	if _, _, err := burst("warm-up", RateCase{}, buyers/4); err != nil {
		return r.abort(err)
	}
	samples := make([][]RateCase, len(cases))
	for round := 1; round <= rounds; round++ {
		for i, c := range cases {
			from, to, err := burst(fmt.Sprintf("%s, round %d", c.Name, round), c, buyers)
			if err != nil {
				return r.abort(err)
			}
			c.Buyers = buyers
			measureBurst(&c, r.load.snapshot(), from, to+time.Nanosecond)
			samples[i] = append(samples[i], c)
		}
	}
	var allUp float64
	for i := range cases {
		c := medianCase(samples[i])
		if c.Down == 0 {
			allUp = c.OrdersPerSecond
		}
		if allUp > 0 {
			c.Ratio = c.OrdersPerSecond / allUp
		}
		r.res.Rates = append(r.res.Rates, c)
		r.note("%s: %.1f orders/s (median of %v; %.2fx all up), 503 to %d of %d buyers (%.2f%%), %d of unknown outcome",
			c.Name, c.OrdersPerSecond, c.RoundRates, c.Ratio, c.Responses503, c.Buyers, 100*c.Share503, c.Unknown)
		if c.Unknown > 0 {
			r.fail("%s: %d orders of unknown outcome", c.Name, c.Unknown)
		}
		if c.Share503 >= 0.01 {
			r.fail("%s: %d of %d buyers (%.1f%%) answered 503, 1%% allowed", c.Name, c.Responses503, c.Buyers, 100*c.Share503)
		}
		if c.Down > 0 && c.Ratio < 0.7 {
			if e.Short {
				r.warn("%s: %.1f orders/s, %.2fx the %.1f with every server up (0.7x expected; short form)", c.Name, c.OrdersPerSecond, c.Ratio, allUp)
			} else {
				r.fail("%s: %.1f orders/s, %.2fx the %.1f with every server up, 0.7x required", c.Name, c.OrdersPerSecond, c.Ratio, allUp)
			}
		}
	}
	return r.finish(ctx)
}

// measureBurst fills in c's figures from the orders called in [from, to).
func measureBurst(c *RateCase, orders []*order, from, to time.Duration) {
	f := figures(orders, from, to)
	c.Created, c.Responses503, c.Unknown = f.Created, f.Responses503, f.Unknown
	last := time.Duration(-1)
	for _, o := range orders {
		for _, a := range o.attempts {
			if a.answer == ansCreated && a.call >= from && a.call < to && a.ret > last {
				last = a.ret
			}
		}
	}
	if last > from {
		c.SellSeconds = seconds(last - from)
		c.OrdersPerSecond = float64(c.Created) / (last - from).Seconds()
	}
}

// medianCase sums the rounds of one case: the rate and the time to sell
// out of its median round, the 503s and unknown outcomes of all of them.
func medianCase(rounds []RateCase) RateCase {
	sorted := slices.Clone(rounds)
	slices.SortFunc(sorted, func(a, b RateCase) int { return cmp.Compare(a.OrdersPerSecond, b.OrdersPerSecond) })
	c := sorted[len(sorted)/2]
	c.Buyers, c.Created, c.Responses503, c.Unknown, c.RoundRates = 0, 0, 0, 0, nil
	for _, r := range rounds {
		c.Buyers += r.Buyers
		c.Created += r.Created
		c.Responses503 += r.Responses503
		c.Unknown += r.Unknown
		c.RoundRates = append(c.RoundRates, math.Round(r.OrdersPerSecond*10)/10)
	}
	if c.Buyers > 0 {
		c.Share503 = float64(c.Responses503) / float64(c.Buyers)
	}
	return c
}
