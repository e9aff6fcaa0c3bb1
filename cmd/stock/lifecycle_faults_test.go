package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// lifecycleAudit is the part of GET /admin/audit/{sku} the lifecycle's
// faults are checked against.
type lifecycleAudit struct {
	Initial, Available, Ordered, Held, Paid, Returned, Expired, Cancelled int64
	Consistent                                                            bool
}

func auditOf(t *testing.T, p *process, sku string) lifecycleAudit {
	t.Helper()
	var a lifecycleAudit
	adminJSON(t, http.MethodGet, p.url+"/admin/audit/"+sku, "", &a)
	return a
}

// waitAudit polls an instance's audit of sku until done says it is what
// the test waits for: the expiry under test happens in other processes, on
// the database's clock, and the rows are the only signal there is.
func waitAudit(t *testing.T, p *process, sku string, within time.Duration, done func(lifecycleAudit) bool) lifecycleAudit {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		a := auditOf(t, p, sku)
		if done(a) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the audit of %s is %+v", within, sku, a)
		}
		time.Sleep(50 * time.Millisecond) // polling other processes' rows
	}
}

// TestPausedInstancePaysPastTheExpiry: an instance is frozen (SIGSTOP)
// with its buyer's pay in its socket; the hold lapses, and another
// instance's sweep gives the unit back. When the frozen instance wakes and
// serves the pay, the database's clock decides: 409 expired, the order
// stays expired, and the unit came back once.
func TestPausedInstancePaysPastTheExpiry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			url := testdb.URL(t, engine)
			payer := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HOLD_TTL=1s", "HOLD_SWEEP_EVERY=0")
			sweeper := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HOLD_TTL=1s", "HOLD_SWEEP_EVERY=100ms")
			adminJSON(t, http.MethodPut, payer.url+"/admin/stock/paused", `{"available":1}`, nil)
			id := placeHeld(t, payer.url, "paused", "buyer")

			if err := payer.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			waitStopped(t, payer.cmd.Process.Pid)
			paid := make(chan string, 1)
			go func() { paid <- settleVia(payer.url, id, "pay", "buyer") }()

			a := waitAudit(t, sweeper, "paused", 15*time.Second, func(a lifecycleAudit) bool { return a.Expired == 1 })
			if !a.Consistent || a.Available != 1 || a.Held != 0 {
				t.Fatalf("after the sweep: %+v", a)
			}
			if err := payer.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if got := <-paid; !strings.HasPrefix(got, "409") || !strings.Contains(got, `"expired"`) {
				t.Errorf("the late pay answered %s, want 409 expired", got)
			}
			a = auditOf(t, sweeper, "paused")
			if !a.Consistent || a.Available != 1 || a.Paid != 0 || a.Expired != 1 || a.Returned != 1 {
				t.Errorf("after the late pay: %+v, want the unit back once and nothing paid", a)
			}
		})
	}
}

// placeHeld places one held order of one unit and returns its id.
func placeHeld(t *testing.T, base, sku, user string) string {
	t.Helper()
	resp, err := http.Post(base+"/orders", "application/json", strings.NewReader(fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":%q}`, sku, user)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(raw), `"state":"held"`) {
		t.Fatalf("order: %d %s", resp.StatusCode, raw)
	}
	_, rest, _ := strings.Cut(string(raw), `"order_id":"`)
	id, _, _ := strings.Cut(rest, `"`)
	return id
}

// settleVia sends a pay or a cancel and returns "<status> <body>".
func settleVia(base, id, action, user string) string {
	resp, err := http.Post(base+"/orders/"+id+"/"+action, "application/json", strings.NewReader(fmt.Sprintf(`{"user_id":%q}`, user)))
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, raw)
}

// TestKillMidSweep: thousands of lapsed holds, one instance sweeping them
// in batches; it is frozen while a sweep transaction is open on the
// database with its batch moved and locked, and killed with SIGKILL. What
// its committed batches returned stays returned, the open batch returns
// nothing (its orders stay held), the books balance at once, and a new
// instance's sweep finishes the job: every unit back exactly once. On both
// engines.
//
// The moment is made, not waited for: the test holds the SKU's stock row,
// the sweep's next batch queues on it (a sweep gives units back last in
// its transaction), the sweeper is frozen while it waits, and the row let
// go: its UPDATE finishes and its transaction stays open, the COMMIT never
// sent. The open batch is then found by the locks it holds, which both
// servers show live: a plain read of the held orders (the committed state)
// against a locking read that skips locked rows (FOR UPDATE SKIP LOCKED)
// gives the held orders another transaction has locked, and the stopped
// sweeper is the only other writer of the test's database. Not
// information_schema.innodb_trx, which MariaDB serves from a cache up to
// 0.1 s old that any other poller on the shared server can keep stale.
func TestKillMidSweep(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) { killMidSweep(t, engine) })
	}
}

func killMidSweep(t *testing.T, engine string) {
	const holds = 3000
	dbURL := testdb.URL(t, engine)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	db, err := store.Open(ctx, dbURL, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// Holds that lapse at once: the sweep is what is under test here.
	placer := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Millisecond), sales.WithPerUserLimit(1))
	if err := placer.StartSale(ctx, "swept", holds); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, holds)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < holds; i += 16 {
				if _, err := placer.PlaceOrder(ctx, inventory.Request{SKU: "swept", Quantity: 1, UserID: fmt.Sprint("u-", i)}); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("placing the holds: %v", err)
	}

	watch := newSweepWatch(t, ctx, engine, dbURL)
	sweeperURL := dbURL
	if engine == "postgres" {
		// The test's database is a schema of a shared database: the
		// sweeper's sessions are told apart by their application_name.
		sweeperURL = withAppName(t, dbURL, "sweeper")
	}
	// A run's time is its period: 250 ms leaves a loaded server room to
	// commit a batch (at 50 ms none committed on MariaDB under make test's
	// load while a batch was one statement per buyer).
	sweeper := startInstance(t, "DATABASE_URL="+sweeperURL, "STRATEGY=conditional", "HOLD_SWEEP_EVERY=250ms")
	// Caught after a batch has committed, so that both halves are
	// tested: what committed stays returned, what was open returns nothing.
	if !pollUntil(ctx, 10*time.Second, func() bool { return watch.count(t, inventory.OrderExpired) > 0 }) {
		t.Fatalf("the sweeper committed no batch within 10s; its log:\n%s", sweeper.stderr)
	}
	// Hold the SKU's stock row: a sweep gives the units back last in its
	// transaction, so the sweeper's next batch queues there with its
	// orders moved and locked. Freeze it while it waits, then let the row
	// go: its UPDATE finishes on the server and the transaction stays
	// open, the COMMIT never sent.
	gate := watch.lockStock(t, "swept")
	if !pollUntil(ctx, 10*time.Second, func() bool { return watch.sweepWaits(t) }) {
		t.Fatal("no sweep queued on the stock row within 10s")
	}
	if err := sweeper.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, sweeper.cmd.Process.Pid)
	gate()
	if !pollUntil(ctx, 5*time.Second, func() bool { return !watch.active(t) }) {
		t.Fatal("a statement of the stopped sweeper runs on for 5s")
	}
	// Two looks that agree: what the stopped sweeper holds stays put.
	caught := watch.lockedHolds(t)
	if again := watch.lockedHolds(t); len(caught) == 0 || !slices.Equal(caught, again) {
		t.Fatalf("the stopped sweeper holds %d, then %d held orders locked; want its open batch", len(caught), len(again))
	}
	t.Logf("the stopped sweeper holds %d held orders locked", len(caught))
	if err := sweeper.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(sweeper)

	// The server ends the dead instance's session and rolls its
	// transaction back: the caught batch's orders are unlocked, still
	// held, and the books balance.
	if !pollUntil(ctx, 10*time.Second, func() bool { return len(watch.lockedHolds(t)) == 0 }) {
		t.Fatal("10s after the kill the dead sweeper's locks are still held")
	}
	states := watch.states(t, caught)
	for _, id := range caught {
		if states[id] != inventory.OrderHeld {
			t.Errorf("order %s of the batch open at the kill is %q, want held (rolled back)", id, states[id])
		}
	}
	mid, err := db.Audit(ctx, "swept")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the kill: %d expired, %d still held", mid.Expired, mid.Held)
	if !mid.Consistent() || mid.Expired == 0 || mid.Held < int64(len(caught)) || mid.Expired+mid.Held != holds || mid.Returned != mid.Expired {
		t.Fatalf("after the kill mid-sweep: %+v, want the books balanced with the open batch held", mid)
	}

	next := startInstance(t, "DATABASE_URL="+dbURL, "STRATEGY=conditional", "HOLD_SWEEP_EVERY=100ms", "PER_USER_LIMIT=1")
	a := waitAudit(t, next, "swept", 30*time.Second, func(a lifecycleAudit) bool { return a.Held == 0 })
	if !a.Consistent || a.Expired != holds || a.Returned != holds || a.Available != holds {
		t.Fatalf("after the sweep finished: %+v, want every unit back once", a)
	}
	// The buyers' counts came back with the units: each may buy again.
	if status, err := postOrder(next.url, "swept", "u-0"); err != nil || status != http.StatusCreated {
		t.Errorf("a buyer whose hold expired orders again: %d %v", status, err)
	}
}

// pollUntil polls cond, which reads the state of other processes, every
// millisecond until it holds or within passes.
func pollUntil(ctx context.Context, within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(time.Millisecond) // polling the server's view of another process
	}
	return true
}

// sweepWatch looks at the sweeper's sessions and locks from a connection of
// the test's own, in each engine's SQL.
type sweepWatch struct {
	ctx       context.Context
	pg        *pgx.Conn
	my        *sql.DB
	connector driver.Connector // MariaDB's, for more connections
}

func newSweepWatch(t *testing.T, ctx context.Context, engine, dbURL string) *sweepWatch {
	t.Helper()
	w := &sweepWatch{ctx: ctx}
	if engine == "postgres" {
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		w.pg = conn
		return w
	}
	cfg, err := dburl.MySQL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.connector = connector
	w.my = sql.OpenDB(connector)
	w.my.SetMaxOpenConns(1)
	t.Cleanup(func() { _ = w.my.Close() })
	return w
}

// active reports whether a statement of the sweeper runs on the server
// (PostgreSQL: its sessions by application_name; MariaDB: any other
// session of the test's database, where only the sweeper works).
func (w *sweepWatch) active(t *testing.T) bool {
	t.Helper()
	var n int
	var err error
	if w.pg != nil {
		err = w.pg.QueryRow(w.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'sweeper' AND state = 'active'`).Scan(&n)
	} else {
		err = w.my.QueryRowContext(w.ctx, `SELECT count(*) FROM information_schema.processlist
			WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command = 'Query'`).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// lockedHolds returns, sorted, the ids of the orders held in the committed
// state that another transaction has locked: every held order of a plain
// read, less those a locking read that skips locked rows gets. Its own
// locks go with its rollback.
func (w *sweepWatch) lockedHolds(t *testing.T) []string {
	t.Helper()
	var all, free []string
	if w.pg != nil {
		tx, err := w.pg.Begin(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		for _, q := range []struct {
			sql  string
			into *[]string
		}{
			{`SELECT id::text FROM orders WHERE state = 'held'`, &all},
			{`SELECT id::text FROM orders WHERE state = 'held' FOR UPDATE SKIP LOCKED`, &free},
		} {
			rows, err := tx.Query(w.ctx, q.sql)
			if err != nil {
				t.Fatal(err)
			}
			if *q.into, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		tx, err := w.my.BeginTx(w.ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		// By primary key, as the sweep locks them.
		for _, q := range []struct {
			sql  string
			into *[]string
		}{
			{`SELECT id FROM orders WHERE state = 'held'`, &all},
			{`SELECT id FROM orders FORCE INDEX (PRIMARY) WHERE state = 'held' FOR UPDATE SKIP LOCKED`, &free},
		} {
			rows, err := tx.QueryContext(w.ctx, q.sql)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				*q.into = append(*q.into, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			_ = rows.Close()
		}
	}
	isFree := make(map[string]bool, len(free))
	for _, id := range free {
		isFree[id] = true
	}
	var locked []string
	for _, id := range all {
		if !isFree[id] {
			locked = append(locked, id)
		}
	}
	slices.Sort(locked)
	return locked
}

// lockStock locks sku's stock row in a transaction on a connection of its
// own, and returns what lets it go.
func (w *sweepWatch) lockStock(t *testing.T, sku string) (release func()) {
	t.Helper()
	if w.pg != nil {
		conn, err := pgx.Connect(w.ctx, w.pg.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		tx, err := conn.Begin(w.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(w.ctx, `SELECT 1 FROM stock WHERE sku = $1 FOR UPDATE`, sku); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Rollback(w.ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	db := sql.OpenDB(w.connector)
	t.Cleanup(func() { _ = db.Close() })
	tx, err := db.BeginTx(w.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(w.ctx, `SELECT 1 FROM stock WHERE sku = ? FOR UPDATE`, sku); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
}

// sweepWaits reports whether a session of the sweeper waits for a lock
// while giving units back.
func (w *sweepWatch) sweepWaits(t *testing.T) bool {
	t.Helper()
	var n int
	var err error
	if w.pg != nil {
		err = w.pg.QueryRow(w.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'sweeper' AND state = 'active' AND wait_event_type = 'Lock'
			  AND query LIKE '%SET available = available +%'`).Scan(&n)
	} else {
		err = w.my.QueryRowContext(w.ctx, `SELECT count(*) FROM information_schema.processlist
			WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command = 'Query'
			  AND info LIKE '%SET available = available +%'`).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// count counts the orders in state, as committed.
func (w *sweepWatch) count(t *testing.T, state string) int {
	t.Helper()
	var n int
	var err error
	if w.pg != nil {
		err = w.pg.QueryRow(w.ctx, `SELECT count(*) FROM orders WHERE state = $1`, state).Scan(&n)
	} else {
		err = w.my.QueryRowContext(w.ctx, `SELECT count(*) FROM orders WHERE state = ?`, state).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// states reads the committed state of the orders ids.
func (w *sweepWatch) states(t *testing.T, ids []string) map[string]string {
	t.Helper()
	states := map[string]string{}
	for _, id := range ids {
		var state string
		var err error
		if w.pg != nil {
			err = w.pg.QueryRow(w.ctx, `SELECT state FROM orders WHERE id::text = $1`, id).Scan(&state)
		} else {
			err = w.my.QueryRowContext(w.ctx, `SELECT state FROM orders WHERE id = ?`, id).Scan(&state)
		}
		if err != nil {
			t.Fatal(err)
		}
		states[id] = state
	}
	return states
}

// waitExited waits for p to exit and leaves its exit for the test's
// cleanup, which waits for it too.
func waitExited(p *process) {
	err := <-p.exited
	p.exited <- err
}

// withAppName sets the PostgreSQL application_name of a DATABASE_URL, so
// that the server's views tell that instance's sessions apart.
func withAppName(t *testing.T, raw, name string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}
