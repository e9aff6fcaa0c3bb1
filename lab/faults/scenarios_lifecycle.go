package faults

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/jackc/pgx/v5"
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

// catchSweeper catches an instance mid-sweep, its sweep transaction open
// with every write done and its commit not sent. The sweep gives units
// back SKU by SKU (ReturnUnits, the last writes of its transaction), so a
// lock the scenario holds on sku's stock row — a SKU nobody else orders
// now — makes the sweeper that expired lapsed holds of sku wait there,
// with its batch locked and changed. The waiting session names its
// instance (by client port); the instance is stopped (SIGSTOP), the
// scenario's lock let go, and the stopped instance's UPDATE finishes on
// the server: the transaction stays open, as a client stopped before its
// COMMIT leaves it. It is then checked to hold the batch (ten rows or
// more: an order, a pay or a cancel touches three): on PostgreSQL the lock
// manager names who holds a lapsed hold's row lock, on MariaDB
// information_schema.innodb_trx counts its transaction's rows. It returns
// the instance, stopped, the rows, and the tries; nil when none was
// caught.
func catchSweeper(ctx context.Context, instances []*Instance, db *lcDB, sku string) (*Instance, int, int, error) {
	var err error
	var n int
	if !waitUntil(ctx, 10*time.Second, func() bool {
		n, err = lcHeldCount(ctx, db, sku, true)
		return err != nil || n > 0
	}) || err != nil {
		return nil, 0, 0, fmt.Errorf("no hold of %s lapsed within 10s: %v", sku, err)
	}
	for try := 1; try <= 3; try++ {
		in, rows, err := db.catchOnce(ctx, instances, sku)
		if err != nil || in != nil {
			return in, rows, try, err
		}
		if n, err = lcHeldCount(ctx, db, sku, false); err != nil || n == 0 {
			return nil, 0, try, err
		}
	}
	return nil, 0, 3, nil
}

// catchOnce is one try of catchSweeper.
func (d *lcDB) catchOnce(ctx context.Context, instances []*Instance, sku string) (*Instance, int, error) {
	gate, err := d.lockStock(ctx, sku)
	if err != nil {
		return nil, 0, err
	}
	// The sweep runs every second: wait up to three for it to queue.
	var port int
	var qerr error
	waitUntil(ctx, 3*time.Second, func() bool {
		port, qerr = gate.waiter(ctx)
		return qerr != nil || port != 0
	})
	var victim *Instance
	if qerr == nil && port != 0 {
		for _, in := range instances {
			if ports, err := socketPorts(in.p.pid()); err == nil && ports[port] {
				victim = in
				break
			}
		}
	}
	if victim != nil {
		qerr = errors.Join(qerr, victim.Pause())
	}
	qerr = errors.Join(qerr, gate.release())
	if qerr != nil || victim == nil {
		return nil, 0, qerr
	}
	// Its UPDATE of the stock row finishes once the lock is let go. (Its
	// instance's other sessions may stay active: an order of a SKU whose
	// stock row the stopped sweep has updated waits for it.)
	ports := map[int]bool{port: true}
	var active bool
	settled := waitUntil(ctx, 2*time.Second, func() bool {
		active, qerr = d.activeOf(ctx, ports)
		return qerr != nil || !active
	})
	rows := 0
	if settled && qerr == nil {
		rows, qerr = d.openRows(ctx, sku, ports)
	}
	if qerr != nil || rows < 10 {
		return nil, 0, errors.Join(qerr, victim.Resume())
	}
	return victim, rows, nil
}

// stockGate is a transaction holding a stock row's lock.
type stockGate struct {
	pg  pgx.Tx
	my  *sql.Tx
	pid int
}

// lockStock locks sku's stock row in a transaction of the scenario's own.
func (d *lcDB) lockStock(ctx context.Context, sku string) (*stockGate, error) {
	g := &stockGate{}
	if d.pg != nil {
		tx, err := d.pg.Begin(ctx)
		if err != nil {
			return nil, err
		}
		g.pg = tx
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&g.pid); err != nil {
			return nil, errors.Join(err, g.release())
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM stock WHERE sku = $1 FOR UPDATE`, sku); err != nil {
			return nil, errors.Join(err, g.release())
		}
		return g, nil
	}
	tx, err := d.my.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	g.my = tx
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM stock WHERE sku = ? FOR UPDATE`, sku); err != nil {
		return nil, errors.Join(err, g.release())
	}
	return g, nil
}

// waiter returns the client port of a session whose sweep waits for the
// gate's lock (0: none yet), from the server's live views: PostgreSQL's
// lock manager; MariaDB's process list, where a session waiting for a row
// lock shows its statement.
func (g *stockGate) waiter(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var port int
	if g.pg != nil {
		// Within a transaction pg_stat_activity answers from the snapshot
		// of its first read, unless that is cleared.
		if _, err := g.pg.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return 0, err
		}
		err := g.pg.QueryRow(ctx, `SELECT COALESCE(min(client_port), 0) FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE '%UPDATE stock SET available = available +%'`, g.pid).Scan(&port)
		return port, err
	}
	var host sql.NullString
	err := g.my.QueryRowContext(ctx, `SELECT min(HOST) FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query' AND INFO LIKE '%UPDATE stock SET available = available +%'`).Scan(&host)
	if err != nil || !host.Valid {
		return 0, err
	}
	return portOf(host.String), nil
}

func (g *stockGate) release() error {
	if g.pg != nil {
		return g.pg.Rollback(context.Background())
	}
	return g.my.Rollback()
}

// openRows returns the rows the open transaction of the sessions whose
// client port is in ports holds: on PostgreSQL, the lapsed holds of sku
// another transaction has locked, if a session of ports is the one the
// lock manager names for the first; on MariaDB, the most rows one of them
// has locked or changed (information_schema.innodb_trx, read once its
// cache is current: see innodbTrxIdle).
func (d *lcDB) openRows(ctx context.Context, sku string, ports map[int]bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		locked, err := d.pgLockedHolds(ctx, sku)
		if err != nil || len(locked) == 0 {
			return 0, err
		}
		port, err := d.pgHolderOf(ctx, locked[0])
		if err != nil || !ports[port] {
			return 0, err
		}
		return len(locked), nil
	}
	pause(ctx, innodbTrxIdle)
	rows, err := d.my.QueryContext(ctx, `SELECT p.HOST, GREATEST(t.trx_rows_locked, t.trx_rows_modified)
		FROM information_schema.PROCESSLIST p JOIN information_schema.INNODB_TRX t ON t.trx_mysql_thread_id = p.ID
		WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() AND p.COMMAND = 'Sleep'`)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	most := 0
	for rows.Next() {
		var host string
		var n int
		if err := rows.Scan(&host, &n); err != nil {
			return 0, err
		}
		if ports[portOf(host)] {
			most = max(most, n)
		}
	}
	return most, rows.Err()
}

// activeOf reports whether a session whose client port is in ports runs a
// statement, from the server's live session list.
func (d *lcDB) activeOf(ctx context.Context, ports map[int]bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		rows, _ := d.pg.Query(ctx, `SELECT client_port FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND client_port IS NOT NULL AND state = 'active'`)
		defer rows.Close()
		for rows.Next() {
			var port int
			if err := rows.Scan(&port); err != nil {
				return false, err
			}
			if ports[port] {
				return true, nil
			}
		}
		return false, rows.Err()
	}
	rows, err := d.my.QueryContext(ctx, `SELECT HOST FROM information_schema.PROCESSLIST
		WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query'`)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var host string
		if err := rows.Scan(&host); err != nil {
			return false, err
		}
		if ports[portOf(host)] {
			return true, nil
		}
	}
	return false, rows.Err()
}

func portOf(host string) int {
	p, _ := strconv.Atoi(host[strings.LastIndexByte(host, ':')+1:])
	return p
}

// innodbTrxIdle is how long InnoDB serves information_schema.innodb_trx
// from its cache after the last read: the scenario reads it after that
// long without a read (it is the private server's only reader), so the
// view is current.
const innodbTrxIdle = 110 * time.Millisecond

// pgLockedHolds returns the lapsed holds of sku that another transaction
// has locked. Its own locks go with its rollback, a moment later.
func (d *lcDB) pgLockedHolds(ctx context.Context, sku string) ([]string, error) {
	tx, err := d.pg.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	const lapsed = `SELECT id::text FROM orders WHERE sku = $1 AND state = 'held' AND expires_at <= statement_timestamp()`
	rows, _ := tx.Query(ctx, lapsed, sku)
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	rows, _ = tx.Query(ctx, lapsed+` FOR UPDATE SKIP LOCKED`, sku)
	free, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var locked []string
	for _, id := range all {
		if !slices.Contains(free, id) {
			locked = append(locked, id)
		}
	}
	return locked, nil
}

// pgHolderOf returns the client port of the session holding order id's
// row lock (0 when none is found within a second): a session of its own
// waits for the row, for at most a second, and the lock manager names
// whom it waits for.
func (d *lcDB) pgHolderOf(ctx context.Context, id string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	waiter, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return 0, err
	}
	defer waiter.Close(context.WithoutCancel(ctx))
	var pid int
	if err := waiter.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return 0, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Ends by lock_timeout, or at once if the row is free.
		_, _ = waiter.Exec(ctx, `SET lock_timeout = '1s'`)
		tx, err := waiter.Begin(ctx)
		if err != nil {
			return
		}
		_, _ = tx.Exec(ctx, `SELECT 1 FROM orders WHERE id::text = $1 FOR UPDATE`, id)
		_ = tx.Rollback(context.WithoutCancel(ctx))
	}()
	defer func() { <-done }()
	port := 0
	var qerr error
	waitUntil(ctx, time.Second, func() bool {
		qerr = d.pg.QueryRow(ctx, `SELECT COALESCE((SELECT a.client_port FROM pg_stat_activity a
			WHERE a.pid = (pg_blocking_pids($1))[1]), 0)`, pid).Scan(&port)
		return qerr != nil || port != 0
	})
	return port, qerr
}
