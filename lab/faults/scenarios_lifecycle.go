package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// The faults of scenario 11 (orders that come back).
const (
	// LifecycleSweeperKill: kill -9 of the instance that is sweeping,
	// stopped with a sweep transaction open.
	LifecycleSweeperKill = "sweeper-kill"
	// LifecycleDatabaseCrash: the database server killed -9 while an
	// instance's sweep transaction is open, then started again.
	LifecycleDatabaseCrash = "database-crash"
)

// LifecycleFigures sum a run of scenario 11.
type LifecycleFigures struct {
	HoldTTL string `json:"hold_ttl"`
	// Requests by kind, and the answers that matter.
	Orders        int `json:"orders"`
	Created       int `json:"created"`
	SoldOut       int `json:"sold_out"`
	LimitReached  int `json:"limit_reached"`
	Pays          int `json:"pays"`
	Paid          int `json:"paid"`        // pays answered 200 (retries included)
	PayExpired    int `json:"pay_expired"` // pays answered 409 expired
	Cancels       int `json:"cancels"`
	Cancelled     int `json:"cancelled"`
	CancelExpired int `json:"cancel_expired"`
	Reads         int `json:"reads"`
	Unknown       int `json:"unknown"`       // requests of unknown outcome
	Responses503  int `json:"responses_503"` // any 503
	Refused       int `json:"refused"`       // connection refused (a dead instance)
	// The abandoned holds placed at once for the sweep, in how many
	// bursts, and what the fault caught: the instance, the rows its open
	// sweep transaction held (PostgreSQL: lapsed holds it had locked;
	// MariaDB: rows its transaction locked or changed) and the tries.
	BurstHolds int `json:"burst_holds"`
	Bursts     int `json:"bursts"`
	CaughtIn   int `json:"caught_instance"`
	CaughtRows int `json:"caught_rows"`
	CatchTries int `json:"catch_tries"`
	// Holds left after the drain (must be 0) and how long it took.
	HeldAtDrain  int     `json:"held_after_drain"`
	DrainSeconds float64 `json:"drain_seconds"`
	// From the rows at the end, over every SKU: units on sale (initial and
	// restocked), available, paid, returned (cancelled or expired orders).
	InitialUnits    int64 `json:"initial_units"`
	AvailableUnits  int64 `json:"available_units"`
	PaidUnits       int64 `json:"paid_units"`
	ReturnedUnits   int64 `json:"returned_units"`
	ExpiredOrders   int   `json:"expired_orders"`
	CancelledOrders int   `json:"cancelled_orders"`
	// 201s per second of the load (the burst aside) before the fault and
	// after it ended (from the restart of what was killed).
	CreatedPerSecondBefore float64 `json:"created_per_second_before"`
	CreatedPerSecondAfter  float64 `json:"created_per_second_after"`
	// The per-order check: orders, operations, illegal, gave up.
	CheckedOrders int `json:"checked_orders"`
	CheckedOps    int `json:"checked_operations"`
	IllegalOrders int `json:"illegal_orders"`
	UnknownOrders int `json:"unknown_orders"`
}

// lcAudit is GET /admin/audit/{sku} with the lifecycle's fields.
type lcAudit struct {
	SKU                             string `json:"sku"`
	Initial, Restocked, Available   int64
	Held, Paid, Returned, Cancelled int64
	Expired                         int64
	Consistent                      bool
}

// lifecycleHoldTTL is the holds' HOLD_TTL in scenarios 11 and 12.
const lifecycleHoldTTL = 2 * time.Second

// lifecycleLoad is the load of scenarios 11 and 12: its length d, the
// buyers' spec, and how many abandoned holds the burst places. The load
// runs until d/3 after the fault has ended (bounded by 3d and maxOrders),
// so that the sales after it are measured.
func (e *Env) lifecycleLoad() (d time.Duration, spec lcSpec, burstHolds int) {
	d = e.scale(30*time.Second, 7500*time.Millisecond)
	spec = lcSpec{workers: 64, duration: 3 * d, maxOrders: 30000, timeout: 5 * time.Second, buyersPerSKU: 400,
		payShare: 0.4, cancelShare: 0.2, think: 2600 * time.Millisecond}
	burstHolds = 1000
	if e.Short {
		burstHolds, spec.workers = 600, 32
	}
	return d, spec, burstHolds
}

// LifecycleFault is scenario 11: orders that come back under faults. Three
// instances with HOLD_TTL=2s, the sweep every second, PER_USER_LIMIT=1,
// and a bounded load of buyers who order one unit and then pay, cancel or
// walk away (some pay or cancel after the hold lapsed, some twice, some
// change their mind). A burst of abandoned holds is placed at once; once
// they lapse, the instance that sweeps them is caught with its sweep
// transaction open, every write done and its commit not sent
// (catchSweeper), and stopped; then fault LifecycleSweeperKill kills it -9
// (restarted 2 s later; 1 s in the short form), or LifecycleDatabaseCrash
// kills the database server -9 (started again 3 s later; 2 s). After the
// load, every lapsed hold is left to the sweep, and the rows are checked:
// every 201 an order row, every answer to a pay, cancel or read true to
// the final row, every unit of a cancelled or expired order back once
// (initial + restocked = available + held + paid, the audit too), no buyer
// above the limit and its count given back once, and each order's history
// linearizable (lcModel). Sales must go on after the fault. server is the
// private database server (required for the crash; without it the
// sweeper's kill takes a database from NewDatabase).
func (e *Env) LifecycleFault(ctx context.Context, engine string, server *DBServer, fault string) Result {
	d, spec, burstHolds := e.lifecycleLoad()
	ttl := lifecycleHoldTTL
	title := map[string]string{
		LifecycleSweeperKill:   "orders that come back: kill -9 of the instance that is sweeping, mid-sweep, then a restart",
		LifecycleDatabaseCrash: "orders that come back: the database killed -9 mid-sweep and restarted",
	}[fault]
	r := e.newRun(11, fmt.Sprintf("11-lifecycle-%s/%s/conditional", fault, engine), title,
		Config{Engine: engine, Strategy: strategies.NameConditional, Safe: true, Instances: 3, OrderTimeout: "3s"})
	if title == "" {
		return r.abort(fmt.Errorf("unknown lifecycle fault %q", fault))
	}
	if server != nil {
		url, err := server.NewDatabase(ctx, "faults_"+randomHex(4))
		if err != nil {
			return r.abort(err)
		}
		r.dbURL = url
	} else if fault == LifecycleDatabaseCrash {
		return r.abort(fmt.Errorf("%w: no private %s server", ErrMissing, engine))
	}
	if err := r.setUp(ctx, 0, "HOLD_TTL="+ttl.String(), "HOLD_SWEEP_EVERY=1s", "PER_USER_LIMIT=1"); err != nil {
		return r.abort(err)
	}
	defer r.close()
	skus := skuNames("s11", 2)
	// Enough that paid units do not sell the SKUs out before the load
	// ends: the rates before and after the fault compare sales, not a
	// sold-out SKU.
	r.res.Config.StockPerSKU = 600
	if e.Short {
		r.res.Config.StockPerSKU = 300
	}
	if err := r.startSales(ctx, skus, r.res.Config.StockPerSKU); err != nil {
		return r.abort(err)
	}
	// The burst's SKU: as many units as holds, back on sale after each
	// burst's sweep.
	sweepSKU := "s11-sweep"
	if err := r.startSales(ctx, []string{sweepSKU}, int64(burstHolds)); err != nil {
		return r.abort(err)
	}
	db, err := openLcDB(ctx, r.dbURL)
	if err != nil {
		return r.abort(err)
	}
	defer db.close()

	lf := &LifecycleFigures{HoldTTL: ttl.String(), CaughtIn: -1}
	r.res.Lifecycle = lf
	c := &r.res.Config
	c.Workers, c.ClientTimeout = spec.workers, spec.timeout.String()
	l := startLifecycleLoad(ctx, r.cluster.Instances, skus, spec)
	stopLoad := func() { l.stop(); l.wait() }
	event := r.eventLog(l.now)

	pause(ctx, d/5)
	var victim *Instance
	var stoppedAt time.Duration
	for burst := 1; burst <= 3 && victim == nil; burst++ {
		ids := l.burst(ctx, sweepSKU, fmt.Sprintf("burst%d", burst), burstHolds, 32)
		lf.Bursts, lf.BurstHolds = burst, lf.BurstHolds+len(ids)
		event("burst %d: %d abandoned holds of %s placed at once", burst, len(ids), sweepSKU)
		var rows, tries int
		victim, rows, tries, err = catchSweeper(ctx, r.cluster.Instances, db, sweepSKU)
		lf.CatchTries += tries
		if err != nil {
			stopLoad()
			return r.abort(err)
		}
		if victim != nil {
			stoppedAt = l.now()
			lf.CaughtIn, lf.CaughtRows = victim.Index, rows
			event("SIGSTOP instance %d (try %d) with its sweep transaction open: %d rows locked or changed", victim.Index, lf.CatchTries, rows)
		}
	}
	if victim == nil {
		stopLoad()
		return r.abort(fmt.Errorf("after %d bursts and %d tries no instance was caught with a sweep transaction open", lf.Bursts, lf.CatchTries))
	}

	var faultAt, backAt, answersAt time.Duration
	switch fault {
	case LifecycleSweeperKill:
		faultAt = event("kill -9 instance %d (pid %d) mid-sweep", victim.Index, victim.p.pid())
		if err := victim.Kill(); err != nil {
			stopLoad()
			return r.abort(err)
		}
		pause(ctx, e.scale(2*time.Second, time.Second))
		backAt = event("restart instance %d", victim.Index)
		if err := victim.Restart(ctx); err != nil {
			stopLoad()
			return r.abort(err)
		}
		answersAt = event("instance %d ready", victim.Index)
	case LifecycleDatabaseCrash:
		faultAt = event("kill -9 the %s server mid-sweep", engine)
		err := server.Crash()
		// The stopped sweeper goes on and finds its connection gone.
		err = errors.Join(err, victim.Resume())
		if err != nil {
			stopLoad()
			return r.abort(err)
		}
		pause(ctx, e.scale(3*time.Second, 2*time.Second))
		backAt = event("start the %s server (crash recovery)", engine)
		if err := server.Start(ctx); err != nil {
			stopLoad()
			return r.abort(err)
		}
		answersAt = event("the %s server answers", engine)
		// The scenario's own connection went with the server.
		db.close()
		if db, err = openLcDB(ctx, r.dbURL); err != nil {
			stopLoad()
			return r.abort(err)
		}
	}
	pause(ctx, d/3)
	stopLoad()
	end := l.now()
	c.LoadSeconds = seconds(end)
	// The load is closed (each buyer waits for its answers and thinks):
	// its rate is what it offered, not a target.
	c.Rate = float64(countFunc(l.snapshot(), func(op lcOp) bool { return op.Kind == lcOrder })) / end.Seconds()

	// Every hold placed has lapsed within HOLD_TTL of the load's end; the
	// sweep must then return every one of them.
	drainFrom := time.Now()
	var held int
	waitUntil(ctx, 30*time.Second, func() bool {
		held, err = lcHeldCount(ctx, db, "", false)
		return err == nil && held == 0
	})
	lf.HeldAtDrain, lf.DrainSeconds = held, seconds(time.Since(drainFrom))
	if held > 0 {
		r.fail("%d orders are still held 30s after the load ended: the sweep did not return them", held)
	}
	tables, err := readLifecycle(ctx, r.dbURL)
	if err != nil {
		return r.abort(fmt.Errorf("read the rows: %w", err))
	}
	readAt := l.now()
	audits := map[string]lcAudit{}
	for _, sku := range append(skus, sweepSKU) {
		var a lcAudit
		if err := r.cluster.adminCall(ctx, http.MethodGet, "/admin/audit/"+sku, "", &a); err != nil {
			return r.abort(fmt.Errorf("audit %s: %w", sku, err))
		}
		audits[sku] = a
	}
	ops := l.snapshot()
	r.checkLifecycle(ops, l, tables, audits, readAt)
	r.lifecycleAvailability(ops, fault, stoppedAt, faultAt, backAt, answersAt, end)
	r.res.Phases = []Phase{
		{Name: "before the fault", FromS: 0, ToS: seconds(faultAt), Figures: lcFigures(ops, 0, faultAt)},
		{Name: "fault", FromS: seconds(faultAt), ToS: seconds(answersAt), Figures: lcFigures(ops, faultAt, answersAt)},
		{Name: "after", FromS: seconds(answersAt), ToS: seconds(end), Figures: lcFigures(ops, answersAt, end+time.Hour)},
	}
	f := lcFigures(ops, 0, end+time.Hour)
	f.RecoverySeconds = r.res.Figures.RecoverySeconds
	f.OrderRows, f.UnitsSold = len(tables.orders), lf.PaidUnits
	f.OversoldUnits, f.LostOrders, f.PhantomOrders = r.res.Figures.OversoldUnits, r.res.Figures.LostOrders, r.res.Figures.PhantomOrders
	r.res.Figures = f
	// The load's SKUs; the burst's is in the lifecycle figures.
	r.res.Config.SKUs = len(skus)
	return r.conclude()
}
