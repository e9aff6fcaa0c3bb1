package faults

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// LifecycleRedisKill is the fault of scenario 12: the reservation strategies'
// durable Redis killed -9 while returns (cancels, expiries) are on their way
// to it through the relay, and started again from its append-only file.
const LifecycleRedisKill = "redis-kill"

// reserveKeyPrefix is the prefix of the reservation's Redis keys: the
// service's default (reservation.New), which cmd/stock does not change.
const reserveKeyPrefix = "stock:"

// RelayFigures sum what scenario 12 did to the relay and what it found in
// Redis and the database at the end.
type RelayFigures struct {
	// At the kill: the orders marked for the relay (relay_pending, every
	// SKU), and the burst's orders expired and still held; Marked says
	// whether a mark was seen (returns committed and not yet in Redis).
	MarkedAtKill       int  `json:"marked_at_kill"`
	BurstExpiredAtKill int  `json:"burst_expired_at_kill"`
	BurstHeldAtKill    int  `json:"burst_held_at_kill"`
	CaughtMarks        bool `json:"caught_marks"`
	// The restock sent while Redis was down (one instance, no retry), its
	// answer, and the restock rows the database holds at the end.
	RestockUnits  int64  `json:"restock_units"`
	RestockAnswer string `json:"restock_answer"`
	// Orders and restocks marked when Redis was started again, and how
	// long after it answered none of them was marked any more.
	MarkedAtRestart   int      `json:"marked_at_restart"`
	RestocksAtRestart int      `json:"restocks_marked_at_restart"`
	RelayedAfterS     *float64 `json:"relayed_after_seconds"`
	// Redis's downtime: kill to answering again (its start included).
	DownSeconds  float64 `json:"down_seconds"`
	ReadySeconds float64 `json:"restart_to_answer_seconds"`
	// While Redis was down: orders called, their 201s (must be 0), 503s,
	// unknown outcomes and the slowest answer; pays and cancels called and
	// those answered with a state (the database's).
	DownOrders      int     `json:"down_orders"`
	DownCreated     int     `json:"down_created"`
	Down409         int     `json:"down_409"`
	DownWaited      int     `json:"down_answered_after_restart"`
	Down503         int     `json:"down_503"`
	DownUnknown     int     `json:"down_unknown"`
	DownSlowestS    float64 `json:"down_slowest_order_seconds"`
	DownSettles     int     `json:"down_settles"`
	DownSettled     int     `json:"down_settles_answered"`
	AfterFirst201S  float64 `json:"after_first_201_seconds"`
	After503        int     `json:"after_503"`
	NotYetWritten   int     `json:"not_yet_written_404"`
	DrainSeconds    float64 `json:"drain_seconds"`
	DrainedPending  int64   `json:"pending_after_drain"`
	DrainedRelaying int64   `json:"relaying_after_drain"`
	// At the end, over every SKU: Redis (its sale hashes and sets) and the
	// database (the stock, order and restock rows).
	RedisAvailable      int64 `json:"redis_available"`
	DBAvailable         int64 `json:"db_available"`
	RedisOrders         int64 `json:"redis_orders"`
	DBOrders            int64 `json:"db_orders"`
	RedisReturnedUnits  int64 `json:"redis_returned_units"`
	DBReturnedUnits     int64 `json:"db_returned_units"`
	RedisReturnedOrders int64 `json:"redis_returned_orders"`
	RedisReturnedSet    int64 `json:"redis_returned_set"`
	DBReturnedOrders    int64 `json:"db_returned_orders"`
	RedisRestocked      int64 `json:"redis_restocked"`
	DBRestocked         int64 `json:"db_restocked"`
	ReturnsMissing      int   `json:"returns_missing_in_redis"`
	ReturnsExtra        int   `json:"returns_extra_in_redis"`
	BuyerCounts         int   `json:"buyer_counts_in_redis"`
	// From the instances' logs: relays that failed (units left marked),
	// the check of the restarted Redis giving it returns and restocks again
	// (lines, and the count they sum), and ERROR lines.
	LogRelayFailed   int    `json:"log_relay_failed"`
	LogReturnAgain   int    `json:"log_return_again"`
	LogReturnedAgain int    `json:"log_returned_again"`
	LogErrors        int    `json:"log_errors"`
	LogFirstError    string `json:"log_first_error,omitempty"`
}

// rlcAudit is GET /admin/audit/{sku} of a reservation strategy.
type rlcAudit struct {
	lcAudit
	Pending  int64
	Relaying int64
	Drift    string
}

// LifecycleRedisKill is scenario 12: orders that come back on a
// reservation strategy (redis-reserve, redis-watch), whose Redis is killed
// -9 while returns are relayed to it. Three instances with HOLD_TTL=2s,
// the sweep every second, PER_USER_LIMIT=1 and scenario 11's load (pay,
// cancel, walk away). A burst of abandoned holds is placed at once; when
// the sweep has expired some of them and not all, and the database shows
// orders marked for the relay (returns committed, not yet in Redis),
// the durable Redis is killed -9; a restock is sent while it is down; it
// is started again from its append-only file 2 s later. After the load,
// once nothing is held, pending or relaying, the rows are checked as in
// scenario 11 (every 201 a row, every answer true to the final row, the
// audit consistent and equal to the rows, no buyer above the limit, each
// order's history linearizable), and Redis against the database: its
// available equal to the stock row's, its returned orders exactly the
// cancelled and expired rows (none lost, none twice), its orders the
// rows, its restocks the restock rows, its buyer counts what the rows
// hold or paid. No order may be answered 201 while Redis is down, and
// sales must resume within seconds of its restart.
func (e *Env) LifecycleRedisKill(ctx context.Context, engine string, server *DBServer, strategy string) Result {
	d, spec, burstHolds := e.lifecycleLoad()
	ttl := lifecycleHoldTTL
	const down = 2 * time.Second
	r := e.newRun(12, fmt.Sprintf("12-lifecycle-redis-kill/%s/%s", engine, strategy),
		"orders that come back on "+strategy+": the durable Redis killed -9 while returns are relayed to it, then restarted from its append-only file",
		Config{Engine: engine, Strategy: strategy, Safe: true, Instances: 3, OrderTimeout: "3s"})
	if !isReserved(strategy) {
		return r.abort(fmt.Errorf("scenario 12 runs a reservation strategy, not %q", strategy))
	}
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
	if err := r.setUp(ctx, 0, rEnv, "RESERVE_CLAIM_IDLE=1s", "HOLD_TTL="+ttl.String(), "HOLD_SWEEP_EVERY=1s", "PER_USER_LIMIT=1"); err != nil {
		return r.abort(setUpErr(strategy, err))
	}
	defer r.close()
	node := r.redis[len(r.redis)-1]
	skus := skuNames("s12", 2)
	r.res.Config.StockPerSKU = 600
	if e.Short {
		r.res.Config.StockPerSKU = 300
	}
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	sweepSKU := "s12-sweep"
	if err := r.startSales(ctx, []string{sweepSKU}, int64(burstHolds)); err != nil {
		return r.abort(err)
	}
	all := append(slices.Clone(skus), sweepSKU)
	db, err := openLcDB(ctx, r.dbURL)
	if err != nil {
		return r.abort(err)
	}
	defer db.close()

	lf := &LifecycleFigures{HoldTTL: ttl.String(), CaughtIn: -1}
	rf := &RelayFigures{}
	r.res.Lifecycle, r.res.Relay = lf, rf
	c := &r.res.Config
	c.Workers, c.ClientTimeout = spec.workers, spec.timeout.String()
	l := startLifecycleLoad(ctx, r.cluster.Instances, skus, spec)
	stopLoad := func() { l.stop(); l.wait() }
	event := r.eventLog(l.now)

	pause(ctx, d/5)
	var caught bool
	for burst := 1; burst <= 3 && !caught; burst++ {
		ids := l.burst(ctx, sweepSKU, fmt.Sprintf("burst%d", burst), burstHolds, 32)
		lf.Bursts, lf.BurstHolds = burst, lf.BurstHolds+len(ids)
		event("burst %d: %d abandoned holds of %s placed at once", burst, len(ids), sweepSKU)
		var snap relaySnapshot
		caught, snap, err = catchRelay(ctx, db, sweepSKU)
		if err != nil {
			stopLoad()
			return r.abort(err)
		}
		if caught {
			rf.MarkedAtKill, rf.BurstExpiredAtKill, rf.BurstHeldAtKill, rf.CaughtMarks = snap.marked, snap.expired, snap.held, snap.marked > 0
		}
	}
	if !caught {
		stopLoad()
		return r.abort(fmt.Errorf("after %d bursts the sweep of %s was never caught half done", lf.Bursts, sweepSKU))
	}
	tk := event("kill -9 the reservation Redis mid-sweep: %d orders marked for the relay; of the burst %d expired, %d still held",
		rf.MarkedAtKill, rf.BurstExpiredAtKill, rf.BurstHeldAtKill)
	node.kill()

	// A restock while Redis is down: the database takes it and marks it
	// for the relay. Sent once, to one instance: the admin call of the
	// cluster would try the next instance on a 503, and restock twice.
	pause(ctx, 300*time.Millisecond)
	rf.RestockUnits = 50
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rerr := r.cluster.adminOnce(rctx, r.cluster.Instances[1], http.MethodPost, "/admin/stock/"+skus[0]+"/restock",
		fmt.Sprintf(`{"quantity":%d}`, rf.RestockUnits), nil)
	cancel()
	rf.RestockAnswer = "200"
	if rerr != nil {
		rf.RestockAnswer = firstLine(rerr.Error())
	}
	event("restock %s by %d units through instance 1 while Redis is down: %s", skus[0], rf.RestockUnits, rf.RestockAnswer)

	pause(ctx, tk+down-l.now())
	marked, err := db.markedIDs(ctx, "orders")
	if err == nil {
		var restocks []string
		restocks, err = db.markedIDs(ctx, "restocks")
		rf.RestocksAtRestart = len(restocks)
		marked = append(marked, restocks...)
	}
	if err != nil {
		stopLoad()
		return r.abort(fmt.Errorf("read the marks: %w", err))
	}
	rf.MarkedAtRestart = len(marked) - rf.RestocksAtRestart
	tr := event("restart the reservation Redis with its append-only file (%d bytes); %d orders and %d restocks marked for the relay",
		node.aofBytes(), rf.MarkedAtRestart, rf.RestocksAtRestart)
	if err := node.restartDurable(); err != nil {
		stopLoad()
		return r.abort(err)
	}
	tu := event("the reservation Redis answers")
	rf.DownSeconds, rf.ReadySeconds = seconds(tu-tk), seconds(tu-tr)
	relayed := make(chan *float64, 1)
	go func() { relayed <- waitRelayed(ctx, r.dbURL, marked, l, tu) }()

	pause(ctx, d/3)
	stopLoad()
	end := l.now()
	c.LoadSeconds = seconds(end)
	c.Rate = float64(countFunc(l.snapshot(), func(op lcOp) bool { return op.Kind == lcOrder })) / end.Seconds()
	rf.RelayedAfterS = <-relayed
	if rf.RelayedAfterS == nil {
		r.fail("%d orders and restocks marked for the relay when Redis was restarted were still marked 30s after it answered",
			len(marked))
	}

	// Every order taken is written, every hold lapses and is swept, every
	// return and restock relayed: then Redis and the database must agree.
	drainFrom := time.Now()
	var held int
	var pending, relaying int64
	var audits map[string]rlcAudit
	drained := pollEvery(ctx, 45*time.Second, 100*time.Millisecond, func() bool {
		held, err = lcHeldCount(ctx, db, "", false)
		if err != nil || held > 0 {
			return false
		}
		audits, err = readAudits[rlcAudit](ctx, r, all)
		if err != nil {
			return false
		}
		pending, relaying = 0, 0
		for _, a := range audits {
			pending, relaying = pending+a.Pending, relaying+a.Relaying
		}
		return pending == 0 && relaying == 0
	})
	rf.DrainSeconds, rf.DrainedPending, rf.DrainedRelaying = seconds(time.Since(drainFrom)), pending, relaying
	lf.HeldAtDrain, lf.DrainSeconds = held, rf.DrainSeconds
	if !drained {
		r.fail("45s after the load: %d orders held, %d pending (taken in Redis, not written), %d units relaying (last error: %v)",
			held, pending, relaying, err)
		if audits, err = readAudits[rlcAudit](ctx, r, all); err != nil {
			return r.abort(fmt.Errorf("audit: %w", err))
		}
	}
	tables, err := readLifecycle(ctx, r.dbURL)
	if err != nil {
		return r.abort(fmt.Errorf("read the rows: %w", err))
	}
	restocks, err := db.restockRows(ctx)
	if err != nil {
		return r.abort(fmt.Errorf("read the restocks: %w", err))
	}
	sales := map[string]redisSale{}
	for _, sku := range all {
		s, err := readRedisSale(ctx, node.Addr, sku)
		if err != nil {
			return r.abort(fmt.Errorf("read %s in Redis: %w", sku, err))
		}
		sales[sku] = s
	}
	readAt := l.now()
	ops := l.snapshot()
	checked := r.checkNotYetWritten(ops, l, tables, ttl)
	// The buyers' counts are Redis's (the reserve script keeps them, the
	// relay gives them back); the database keeps none for these
	// strategies. The rows' check compares them with what each buyer's
	// orders hold or paid.
	tables.buyers = map[[2]string]int64{}
	for sku, s := range sales {
		for user, n := range s.buyers {
			tables.buyers[[2]string{sku, user}] = n
		}
		rf.BuyerCounts += len(s.buyers)
	}
	plain := map[string]lcAudit{}
	for sku, a := range audits {
		plain[sku] = a.lcAudit
		if a.Drift != "" {
			r.fail("%s: the audit finds drift: %s", sku, a.Drift)
		}
	}
	r.checkLifecycle(checked, l, tables, plain, readAt)
	r.checkRedisAgainstRows(tables, restocks, sales)
	r.lifecycleAvailability(ops, LifecycleRedisKill, tk, tk, tr, tu, end)
	r.redisKillAvailability(ops, tk, tr, tu, end)
	r.relayLogs()

	r.res.Phases = []Phase{
		{Name: "before the kill", FromS: 0, ToS: seconds(tk), Figures: lcFigures(ops, 0, tk)},
		{Name: "Redis down", FromS: seconds(tk), ToS: seconds(tu), Figures: lcFigures(ops, tk, tu)},
		{Name: "after the restart", FromS: seconds(tu), ToS: seconds(end), Figures: lcFigures(ops, tu, end+time.Hour)},
	}
	f := lcFigures(ops, 0, end+time.Hour)
	f.RecoverySeconds = r.res.Figures.RecoverySeconds
	f.OrderRows, f.UnitsSold = len(tables.orders), lf.PaidUnits
	f.OversoldUnits, f.LostOrders, f.PhantomOrders = r.res.Figures.OversoldUnits, r.res.Figures.LostOrders, r.res.Figures.PhantomOrders
	f.UnseenOrders = r.res.Figures.UnseenOrders
	r.res.Figures = f
	r.res.Config.SKUs = len(skus)
	return r.conclude()
}
