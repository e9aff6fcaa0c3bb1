package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// PausedHolder is scenario 2: a lock holder paused past its lock's TTL.
// Instance 0 is stopped (SIGSTOP) while it takes a share of the load on
// one SKU, so it likely holds or waits for the SKU's lock, and stays
// stopped for longer than LOCK_TTL while the others sell the rest of the
// stock; then it continues (SIGCONT). This is repeated on fresh SKUs. A
// first round pauses deterministically: instance 0 runs with
// FREEZE_HOLDER=true, so its first order stops its own process between the
// read and the write. With FENCING=on the stock must stay exact; with
// FENCING=off an oversell is expected and reported.
//
// For redis-lock and redlock (scenario 2) the lock lives on Redis servers
// and its TTL is LOCK_TTL; for etcd-lock and zk-lock (scenario 7) it lives
// on a private single etcd member or standalone ZooKeeper server, and
// LOCK_TTL is the etcd session's lease TTL or the ZooKeeper session
// timeout (1 s: etcd's smallest lease): the paused holder's session
// expires and its key or node goes with it. Who holds is read from the
// lock service in every case (holderWatch).
func (e *Env) PausedHolder(ctx context.Context, strategy, fencing string) Result {
	ttl := e.scale(time.Second, 500*time.Millisecond)
	servers, rate := 1, 300.0
	scenario := 2
	cfg := Config{Engine: "postgres", Strategy: strategy, Safe: fencing == "on", Instances: 3,
		Fencing: fencing, OrderTimeout: "5s", StockPerSKU: 500}
	switch lockOf(strategy) {
	case strategies.LockRedlock:
		servers, rate = 3, 200
	case strategies.LockTable:
		servers = 0 // the lock lives in the run's own database
	case strategies.LockEtcd:
		servers, scenario, ttl, cfg.EtcdMembers = 0, 7, time.Second, 1
	case strategies.LockZooKeeper:
		servers, scenario, ttl, cfg.ZKServers = 0, 7, time.Second, 1
	}
	cfg.RedisServers, cfg.LockTTL = servers, ttl.String()
	rounds := 3
	if e.Short {
		rounds = 1
	}
	r := e.newRun(scenario, fmt.Sprintf("%d-paused-holder/%s/fencing-%s", scenario, strategy, fencing),
		"a lock holder paused past its lock TTL (SIGSTOP, then SIGCONT)", cfg)
	r.instanceEnv = map[int][]string{0: {"FREEZE_HOLDER=true"}}
	env := []string{"FENCING=" + fencing, "LOCK_TTL=" + ttl.String(), "LOCK_WAIT=3s", "DB_MAX_CONNS=16"}
	if isCoordination(strategy) {
		coEnv, err := r.startCoordinator(strategy)
		if err != nil {
			return r.abort(err)
		}
		env = append(env, coEnv)
	}
	if err := r.setUp(ctx, servers, env...); err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	victim := r.cluster.Instances[0]
	stock := r.res.Config.StockPerSKU
	// Clients wait long enough for the paused holder's answer, so that a
	// late write is a 201 the checker sees; the open-model load keeps the
	// other instances busy meanwhile.
	// Instance 0 takes half the requests, so that under contention it
	// holds the SKU's lock about half of the time (a Locker serves its own
	// waiting goroutines first).
	// A stopped instance holds at most a quarter of the workers (a load
	// balancer's per-backend limit), so the others keep their load while
	// it is stopped, however long that lasts.
	spec := loadSpec{workers: 400, rate: rate, duration: 2 * time.Minute, maxOrders: 1 << 30, timeout: 10 * time.Second,
		weights: []int{2, 1, 1}, perInstance: 100}

	type pausedAt struct {
		sku string
		at  time.Duration
	}
	var pauses []pausedAt
	lockCounters := func() (lost, fenced float64) {
		lost, _ = victim.Counter(ctx, "stock_locks_lost_total")
		fenced, _ = victim.Counter(ctx, "stock_fenced_off_writes_total")
		return lost, fenced
	}
	// Who holds the lock, read from the lock service.
	lockWatch, closeWatch, err := r.holderWatch(strategy)
	if err != nil {
		return r.abort(err)
	}
	defer closeWatch()
	caught := 0
	for round := 0; round <= rounds; round++ {
		sku := fmt.Sprintf("s2-r%d", round)
		if err := r.startSales(ctx, []string{sku}, stock); err != nil {
			return r.abort(err)
		}
		lost0, fenced0 := 0.0, 0.0
		if r.load == nil {
			r.startLoad(ctx, []string{sku}, spec)
		} else {
			lost0, fenced0 = lockCounters()
			r.load.SetSKUs([]string{sku})
		}
		var paused time.Duration
		if round == 0 {
			// FREEZE_HOLDER: instance 0's first order stops its process.
			if !waitUntil(ctx, 10*time.Second, victim.Stopped) {
				return r.abort(fmt.Errorf("instance 0 did not freeze itself"))
			}
			paused = r.event("instance 0 froze itself holding the lock of %s, between its read and its write (FREEZE_HOLDER)", sku)
		} else {
			if !waitUntil(ctx, 10*time.Second, func() bool { return r.load.soldUnits(sku) >= stock/5 }) {
				r.warn("round %d: %s did not sell 20%% of its stock within 10s", round, sku)
			}
			holding, err := pauseHolder(ctx, victim, lockWatch, sku, func() bool { return r.load.soldUnits(sku) < stock*7/10 })
			if err != nil {
				return r.abort(err)
			}
			how := "holding the lock of " + sku + " (its holder did not change while the instance was stopped)"
			if !holding {
				how = "under load on " + sku + ", but it was not caught holding the lock"
			}
			caught += map[bool]int{true: 1}[holding]
			paused = r.event("SIGSTOP instance 0 %s; %d of %d units sold", how, r.load.soldUnits(sku), stock)
		}
		pauses = append(pauses, pausedAt{sku, paused})
		// Stay stopped past the TTL and until the others sold what is left.
		maxPause := e.scale(10*time.Second, 5*time.Second)
		stuck := -1 // transactions of the stopped instance that hold the row
		soldOut := waitUntil(ctx, maxPause, func() bool {
			if r.load.now()-paused < ttl*5/2 {
				return false
			}
			if stuck < 0 {
				// Stopped between its UPDATE and its COMMIT, the instance
				// keeps the row locked after its lock expired: the others
				// then wait for the database, not for the lock.
				stuck = max(0, stuckTransactions(ctx, r.dbURL, ttl*2))
			}
			// Nothing left, so the resumed holder's write (1 to 3 units)
			// oversells whatever its quantity when it is not fenced off.
			a, err := r.cluster.Audit(ctx, sku)
			return err == nil && a.Available == 0
		})
		if !soldOut {
			r.warn("pause %d: the other instances did not sell the rest of %s within %v of the pause, long after the lock's TTL%s",
				round, sku, maxPause, blockedBy(ctx, r.dbURL))
		}
		r.event("SIGCONT instance 0, stopped %.1fs", seconds(r.load.now()-paused))
		if err := victim.Resume(); err != nil {
			return r.abort(err)
		}
		// The tail of the round: the resumed holder's late write, 409s.
		pause(ctx, 1500*time.Millisecond)
		lost1, fenced1 := lockCounters()
		a, _ := r.cluster.Audit(ctx, sku)
		r.note("pause %d (%s): instance 0 lost %.0f lock(s) and had %.0f write(s) fenced off; %s ends with %d available",
			round, sku, lost1-lost0, fenced1-fenced0, sku, a.Available)
		if stuck > 0 {
			r.note("pause %d (%s): instance 0 was stopped inside its database transaction, after its UPDATE: the row stayed locked "+
				"after its lock expired, until PostgreSQL ended the idle session (idle_in_transaction_session_timeout = ORDER_TIMEOUT, %s); "+
				"the others waited for that, not for the lock", round, sku, r.res.Config.OrderTimeout)
		}
	}
	r.load.stop()
	r.note("instance 0 was caught holding the lock in %d of %d external pauses", caught, rounds)
	r.afterLoad = func(orders []*order) {
		// How long the other instances took to sell the paused SKU: about
		// the lock's TTL when instance 0 held its lock.
		var worst *float64
		for _, p := range pauses {
			first := time.Duration(-1)
			for _, o := range orders {
				for _, a := range o.attempts {
					if o.sku == p.sku && a.answer == ansCreated && a.instance != victim.Index && a.call >= p.at && (first < 0 || a.ret < first) {
						first = a.ret
					}
				}
			}
			if first >= 0 && (worst == nil || seconds(first-p.at) > *worst) {
				s := seconds(first - p.at)
				worst = &s
			}
		}
		r.res.Figures.RecoverySeconds = worst
		r.note("recovery here is the longest time the other instances took to sell the paused SKU after a pause")
	}
	return r.finish(ctx)
}

// pauseHolder stops instance with SIGSTOP at a moment it holds the lock of
// sku, as far as can be seen from outside: while it is stopped, the lock's
// holder (its Redis token, its oldest etcd key, its lowest ZooKeeper node)
// stays the same for longer than any running holder keeps it. When the
// holder moves (another instance holds the lock, or nobody), it lets the
// instance go on for a moment and tries again, while more says there is
// stock enough for the others to sell during the pause. It returns with the
// instance stopped, reporting whether it was caught holding the lock.
func pauseHolder(ctx context.Context, in *Instance, holder holderState, sku string, more func() bool) (bool, error) {
	for try := 0; try < 50 && more() && ctx.Err() == nil; try++ {
		if err := in.Pause(); err != nil {
			return false, err
		}
		before, err1 := holder(ctx, sku)
		pause(ctx, 150*time.Millisecond)
		after, err2 := holder(ctx, sku)
		if err1 == nil && err2 == nil && before == after {
			return true, nil
		}
		if err := in.Resume(); err != nil {
			return false, err
		}
		pause(ctx, time.Duration(20+rand.IntN(60))*time.Millisecond)
	}
	return false, in.Pause()
}
