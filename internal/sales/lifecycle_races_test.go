package sales_test

// An adversarial review of "orders that come back" (holds, pay, cancel,
// lazy expiry, the sweep). Each test forces one interleaving with a store
// wrapper that stops a transaction at a chosen statement, and waits for the
// database's own lock waits (pg_blocking_pids, INNODB_LOCK_WAITS) instead of
// sleeping. A failing test is a break of a claim; a passing one documents a
// claim that held under the attack.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// ---------------------------------------------------------------------------
// Harness

// rawDB is a connection of the test's own to the store's database, for
// what the service cannot do: make a hold lapse, ask who waits for whom.
type rawDB struct {
	engine string
	pg     *pgxpool.Pool
	my     *sql.DB
}

// dbWithRawAccess returns a migrated store on a fresh database of engine and a raw
// connection to the same database.
func dbWithRawAccess(t *testing.T, engine string, conns int) (store.Store, *rawDB) {
	t.Helper()
	url := testdb.MigratedURL(t, engine)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := store.Open(ctx, url, conns)
	if err != nil {
		t.Fatalf("open %s: %v", engine, err)
	}
	t.Cleanup(db.Close)
	raw := &rawDB{engine: engine}
	switch engine {
	case "postgres":
		if raw.pg, err = pgxpool.New(ctx, url); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(raw.pg.Close)
	case "mysql":
		cfg, err := dburl.MySQL(url)
		if err != nil {
			t.Fatal(err)
		}
		connector, err := gomysql.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		raw.my = sql.OpenDB(connector)
		t.Cleanup(func() { _ = raw.my.Close() })
	}
	return db, raw
}

// exec runs the statement of the engine and returns the rows it changed.
func (r *rawDB) exec(t *testing.T, pgSQL, mySQL string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if r.engine == "postgres" {
		tag, err := r.pg.Exec(ctx, pgSQL, args...)
		if err != nil {
			t.Fatalf("%s: %v", pgSQL, err)
		}
		return tag.RowsAffected()
	}
	res, err := r.my.ExecContext(ctx, mySQL, args...)
	if err != nil {
		t.Fatalf("%s: %v", mySQL, err)
	}
	n, _ := res.RowsAffected()
	return n
}

// queryInt runs a query of the engine that answers one integer.
func (r *rawDB) queryInt(t *testing.T, pgSQL, mySQL string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	var err error
	if r.engine == "postgres" {
		err = r.pg.QueryRow(ctx, pgSQL, args...).Scan(&n)
	} else {
		err = r.my.QueryRowContext(ctx, mySQL, args...).Scan(&n)
	}
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	return n
}

// lapse makes the holds of the ids lapse by the database's clock.
func (r *rawDB) lapse(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if n := r.exec(t,
			`UPDATE orders SET expires_at = now() - interval '1 second' WHERE id = $1`,
			`UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = ?`, id); n != 1 {
			t.Fatalf("lapse %s: %d rows", id, n)
		}
	}
}

// state reads an order's state straight from the table.
func (r *rawDB) state(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s string
	var err error
	if r.engine == "postgres" {
		err = r.pg.QueryRow(ctx, `SELECT state FROM orders WHERE id = $1`, id).Scan(&s)
	} else {
		err = r.my.QueryRowContext(ctx, `SELECT state FROM orders WHERE id = ?`, id).Scan(&s)
	}
	if err != nil {
		return "none (" + err.Error() + ")"
	}
	return s
}

// waitBlockedBy waits until at least n sessions wait for a lock that the
// session holder holds: the database says so, no clock involved.
func (r *rawDB) waitBlockedBy(t *testing.T, holder int64, n int) {
	t.Helper()
	r.waitBlockedByOr(t, holder, n, nil)
}

// waitBlockedByOr is waitBlockedBy that gives up (false) as soon as
// other is ready.
func (r *rawDB) waitBlockedByOr(t *testing.T, holder int64, n int, other <-chan struct{}) bool {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-other:
			return false
		default:
		}
		// Transitively: a session queued behind another waiter for the same
		// row is blocked by that waiter (PostgreSQL's tuple lock).
		got := r.queryInt(t, `
			WITH RECURSIVE w (pid) AS (
				SELECT pid FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))
				UNION
				SELECT a.pid FROM pg_stat_activity a JOIN w ON w.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT count(*) FROM w`, `
			WITH RECURSIVE w (trx) AS (
				SELECT l.requesting_trx_id FROM information_schema.INNODB_LOCK_WAITS l
				JOIN information_schema.INNODB_TRX b ON b.trx_id = l.blocking_trx_id
				WHERE b.trx_mysql_thread_id = ?
				UNION
				SELECT l.requesting_trx_id FROM information_schema.INNODB_LOCK_WAITS l JOIN w ON w.trx = l.blocking_trx_id)
			SELECT COUNT(*) FROM w`, holder)
		if got >= int64(n) {
			return true
		}
		if time.Now().After(deadline) {
			r.dumpLocks(t)
			t.Fatalf("%d sessions wait for session %d, want %d", got, holder, n)
		}
		// Polling the database's lock table. InnoDB's INFORMATION_SCHEMA
		// transaction tables come from a cache that is refreshed only when
		// it was last read more than 100 ms ago: poll slower than that.
		pause := 5 * time.Millisecond
		if r.engine == "mysql" {
			pause = 150 * time.Millisecond
		}
		time.Sleep(pause)
	}
}

// dumpLocks logs who waits for whom, when a wait did not come.
func (r *rawDB) dumpLocks(t *testing.T) {
	t.Helper()
	if r.engine != "mysql" {
		return
	}
	prow, err := r.my.Query(`SELECT ID, COALESCE(DB, ''), COALESCE(STATE, ''), COALESCE(INFO, '') FROM information_schema.PROCESSLIST WHERE DB = DATABASE()`)
	if err == nil {
		for prow.Next() {
			var id int64
			var db, st, info string
			_ = prow.Scan(&id, &db, &st, &info)
			t.Logf("process %d db %s state %s: %s", id, db, st, info)
		}
		prow.Close()
	}
	rows, err := r.my.Query(`SELECT trx_id, trx_state, trx_mysql_thread_id, COALESCE(trx_query, ''), COALESCE(trx_requested_lock_id, '') FROM information_schema.INNODB_TRX`)
	if err != nil {
		t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, state, q, lock string
		var thread int64
		_ = rows.Scan(&id, &state, &thread, &q, &lock)
		t.Logf("trx %s %s thread %d lock %s: %s", id, state, thread, lock, q)
	}
}

// sessionOf returns the database session of a transaction.
func sessionOf(ctx context.Context, t *testing.T, tx inventory.Tx) int64 {
	for {
		if h, ok := tx.(hookedTx); ok {
			tx = h.Tx
			continue
		}
		break
	}
	s, ok := tx.(interface {
		SessionID(context.Context) (int64, error)
	})
	if !ok {
		t.Errorf("transaction %T has no session id", tx)
		return 0
	}
	id, err := s.SessionID(ctx)
	if err != nil {
		t.Errorf("session id: %v", err)
	}
	return id
}

// hooks stop a transaction at a chosen statement. Each hook runs inside
// the transaction, with the transaction's own tx.
type hooks struct {
	beforeSettle      func(ctx context.Context, tx inventory.Tx, id, to string)
	afterSettle       func(ctx context.Context, tx inventory.Tx, id, to string, moved bool)
	afterExpireLapsed func(ctx context.Context, tx inventory.Tx, expired []inventory.Order)
	beforeInsertOrder func(ctx context.Context, tx inventory.Tx, o inventory.Order)
	afterReadLevel    func(ctx context.Context, tx inventory.Tx, l inventory.Level)
}

type hookedStore struct {
	store.Store
	h *hooks
}

func (s hookedStore) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, hookedTx{Tx: tx, h: s.h})
	})
}

type hookedTx struct {
	inventory.Tx
	h *hooks
}

func (t hookedTx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	if t.h.beforeSettle != nil {
		t.h.beforeSettle(ctx, t, id, to)
	}
	moved, err := t.Tx.SettleOrder(ctx, id, userID, to)
	if err == nil && t.h.afterSettle != nil {
		t.h.afterSettle(ctx, t, id, to, moved)
	}
	return moved, err
}

func (t hookedTx) ExpireLapsed(ctx context.Context, limit int) ([]inventory.Order, error) {
	expired, err := t.Tx.ExpireLapsed(ctx, limit)
	if err == nil && t.h.afterExpireLapsed != nil {
		t.h.afterExpireLapsed(ctx, t, expired)
	}
	return expired, err
}

func (t hookedTx) InsertOrder(ctx context.Context, o inventory.Order) (time.Time, error) {
	if t.h.beforeInsertOrder != nil {
		t.h.beforeInsertOrder(ctx, t, o)
	}
	return t.Tx.InsertOrder(ctx, o)
}

func (t hookedTx) ReadLevel(ctx context.Context, sku string) (inventory.Level, error) {
	l, err := t.Tx.ReadLevel(ctx, sku)
	if err == nil && t.h.afterReadLevel != nil {
		t.h.afterReadLevel(ctx, t, l)
	}
	return l, err
}

// gate stops one transaction: it reports the transaction's session on
// stopped and waits for release.
type gate struct {
	once    sync.Once
	opened  sync.Once
	stopped chan int64
	release chan struct{}
}

// newGate returns a closed gate, opened at the latest when the test ends
// (before its database closes), so that a failed test does not hang.
func newGate(t *testing.T) *gate {
	g := &gate{stopped: make(chan int64, 1), release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

// open lets the stopped transaction go on.
func (g *gate) open() { g.opened.Do(func() { close(g.release) }) }

// stop stops the first caller only.
func (g *gate) stop(ctx context.Context, t *testing.T, tx inventory.Tx) {
	first := false
	g.once.Do(func() { first = true })
	if !first {
		return
	}
	g.stopped <- sessionOf(ctx, t, tx)
	<-g.release
}

func (g *gate) wait(t *testing.T) int64 {
	t.Helper()
	select {
	case s := <-g.stopped:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("the transaction never reached its gate")
		return 0
	}
}

// retries counts the transactions the service ran again, by reason.
type retries struct {
	inventory.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func (r *retries) Retried(_ string, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *retries) count() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.n)
}

// result of an asynchronous call.
type result struct {
	order inventory.Order
	n     int
	err   error
}

func async(f func() (inventory.Order, int, error)) chan result {
	ch := make(chan result, 1)
	go func() {
		o, n, err := f()
		ch <- result{o, n, err}
	}()
	return ch
}

func await(t *testing.T, ch chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(60 * time.Second):
		t.Fatalf("%s never answered", what)
		return result{}
	}
}

func checkAudit(t *testing.T, svc *sales.Service, sku string, initial int64) inventory.Audit {
	t.Helper()
	a, err := svc.Audit(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Consistent() || a.Initial != initial || a.Held+a.Paid+a.Available != initial {
		t.Errorf("audit %+v: initial %d != available + held + paid", a, initial)
	}
	return a
}

func place(t *testing.T, svc *sales.Service, sku, user string, q int64) inventory.Order {
	t.Helper()
	o, err := svc.PlaceOrder(context.Background(), inventory.Request{SKU: sku, Quantity: q, UserID: user})
	if err != nil {
		t.Fatalf("place %s: %v", user, err)
	}
	return o
}

// ---------------------------------------------------------------------------
// Claim 4: bad input is a 4xx and changes nothing.

// TestOrderIDsThatParseAsUUIDsAreNeverABackendFailure: FindOrder (and so
// pay and cancel) validates the id with uuid.Parse, which also accepts
// "urn:uuid:<uuid>" and any 38 characters whose middle 36 are a UUID: its
// "{…}" form never checks the braces, so "(<uuid>)" passes. PostgreSQL's
// uuid type refuses both (SQLSTATE 22P02); wrap files that under no
// sentinel ("postgres: …"), and httpapi answers 500 internal (logged as an
// unexpected error) to malformed input. Want 400 invalid (or 404) on both
// engines; MariaDB (CHAR(36)) answers 404.
func TestOrderIDsThatParseAsUUIDsAreNeverABackendFailure(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 4)
			svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "ids", 1); err != nil {
				t.Fatal(err)
			}
			o := place(t, svc, "ids", "u", 1)
			for _, id := range []string{"(" + o.ID + ")", "urn:uuid:" + o.ID} {
				_, ferr := svc.FindOrder(ctx, id, "u")
				_, perr := svc.PayOrder(ctx, id, "u")
				_, cerr := svc.CancelOrder(ctx, id, "u")
				for _, c := range []struct {
					what string
					err  error
				}{{"GET", ferr}, {"pay", perr}, {"cancel", cerr}} {
					if c.err != nil && !errors.Is(c.err, inventory.ErrInvalid) && !errors.Is(c.err, inventory.ErrOrderNotFound) {
						t.Errorf("%s of order id %q answered %v (no sentinel: HTTP 500); want 400 invalid or 404 not found", c.what, id, c.err)
					}
				}
			}
			if s := raw.state(t, o.ID); s != inventory.OrderHeld {
				t.Errorf("order is %s after requests with malformed ids, want held", s)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Claim 2: pay against expiry, judged by the database's clock.

// TestPayWhoseUpdateRunsAfterTheLapseIsRefused: a pay's transaction begins
// while the hold runs, stalls (a GC pause, a starved CPU) before its UPDATE,
// and the hold lapses by the database's clock meanwhile; nobody expires it
// in between. The UPDATE then runs after expires_at. MariaDB judges it with
// UTC_TIMESTAMP(6), the statement's time, and refuses: 409 expired. On
// PostgreSQL, SettleOrder's now() is the time the transaction BEGAN, so
// "expires_at > now()" still holds and the pay answers 200 paid (with
// settled_at before expires_at), a hold paid after it lapsed: the two
// engines judge the same schedule differently, and PostgreSQL's judge is
// not "the database's clock" at the pay but at the pay's BEGIN
// (statement_timestamp() or clock_timestamp() would be).
func TestPayWhoseUpdateRunsAfterTheLapseIsRefused(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 4)
			g := newGate(t)
			h := &hooks{beforeSettle: func(ctx context.Context, tx inventory.Tx, id, to string) {
				if to == inventory.OrderPaid {
					g.stop(ctx, t, tx)
				}
			}}
			svc := sales.NewService(hookedStore{db, h}, sqlrow.NewConditional(),
				sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "late-pay", 1); err != nil {
				t.Fatal(err)
			}
			o := place(t, svc, "late-pay", "u", 1)

			pay := async(func() (inventory.Order, int, error) {
				p, err := svc.PayOrder(ctx, o.ID, "u")
				return p, 0, err
			})
			g.wait(t) // the pay's transaction has begun; its UPDATE waits
			// The hold now ends 50 ms after this statement (so after the
			// pay's BEGIN), and the database waits until it has lapsed
			// (expiry itself is under test).
			raw.exec(t,
				`UPDATE orders SET expires_at = clock_timestamp() + interval '50 milliseconds' WHERE id = $1`,
				`UPDATE orders SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 50000 MICROSECOND WHERE id = ?`, o.ID)
			raw.exec(t,
				`SELECT pg_sleep(0.1)`, `DO SLEEP(0.1)`)
			if lapsed := raw.queryInt(t,
				`SELECT count(*) FROM orders WHERE id = $1 AND expires_at <= clock_timestamp()`,
				`SELECT COUNT(*) FROM orders WHERE id = ? AND expires_at <= UTC_TIMESTAMP(6)`, o.ID); lapsed != 1 {
				t.Fatal("the hold has not lapsed by the database's clock")
			}
			g.open() // the pay's UPDATE runs now, after the lapse

			r := await(t, pay, "the pay")
			state := raw.state(t, o.ID)
			if !errors.Is(r.err, inventory.ErrOrderExpired) || state != inventory.OrderExpired {
				before := raw.queryInt(t,
					`SELECT count(*) FROM orders WHERE id = $1 AND settled_at < expires_at`,
					`SELECT COUNT(*) FROM orders WHERE id = ? AND settled_at < expires_at`, o.ID)
				t.Errorf("a pay whose UPDATE ran after the hold lapsed (by the database's clock) answered %q, %v; the row is %s (settled_at recorded before expires_at: %v). Want 409 expired, row expired",
					r.order.State, r.err, state, before == 1)
			}
			checkAudit(t, svc, "late-pay", 1)
		})
	}
}

// ---------------------------------------------------------------------------
// Claim 4: a commit whose answer was lost is resolved by reading the state.

// TestCancelWhoseCommitAnswerIsLostAtTheDeadlineIsResolved (PostgreSQL):
// the cancel's COMMIT is slow at the server (a deferred constraint trigger
// stands in for a slow fsync or a stalled WAL write) and outlasts the
// order's deadline. pgx's deadline handler cuts the read, Commit fails,
// wrapCommit says ErrOutcomeUnknown; the server finishes the COMMIT anyway
// (nothing there notices the client left). transition then looks the order
// up to resolve the outcome, but with the same, expired, context: the
// lookup fails and the cancel answers 503 "commit outcome unknown … retry
// with the same Idempotency-Key", although the row says cancelled and the
// unit is back. PlaceOrder's resolveUnknownCommit gives its lookup a fresh
// 2 s for exactly this; transition does not. (On MariaDB database/sql's
// Commit takes no context, so this path is PostgreSQL's.)
func TestCancelWhoseCommitAnswerIsLostAtTheDeadlineIsResolved(t *testing.T) {
	db, raw := dbWithRawAccess(t, "postgres", 4)
	// The COMMIT of the cancel runs this trigger, which sleeps until the
	// transaction's statement_timeout (the order's time left at BEGIN,
	// counted from the COMMIT) cancels the sleep; the commit then goes on.
	// Only the order's own transaction sleeps (its timeout is under the
	// 500 ms order time): the one that resolves the lost answer (2 s of
	// its own) commits at once. Under load the order's time can run out
	// before its COMMIT is sent; the resolving transaction then moves the
	// order itself, and a sleep there too lost that answer as well (CI).
	raw.exec(t, `
		CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF (SELECT setting::int FROM pg_settings WHERE name = 'statement_timeout') NOT BETWEEN 1 AND 999 THEN
				RETURN NULL;
			END IF;
			BEGIN
				PERFORM pg_sleep(10);
			EXCEPTION WHEN query_canceled THEN
				NULL;
			END;
			RETURN NULL;
		END $$`, "")
	raw.exec(t, `
		CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON orders
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.state = 'cancelled') EXECUTE FUNCTION slow_commit()`, "")
	svc := sales.NewService(db, sqlrow.NewConditional(),
		sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(500*time.Millisecond))
	ctx := context.Background()
	if err := svc.StartSale(ctx, "lost", 1); err != nil {
		t.Fatal(err)
	}
	o := place(t, svc, "lost", "u", 1)
	got, err := svc.CancelOrder(ctx, o.ID, "u")
	// The server's COMMIT ends shortly after the client gave up: wait for
	// it (the database's state, polled).
	deadline := time.Now().Add(20 * time.Second)
	state := raw.state(t, o.ID)
	for state == inventory.OrderHeld && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		state = raw.state(t, o.ID)
	}
	if state != inventory.OrderCancelled {
		t.Fatalf("the row is %s: the slow COMMIT did not land", state)
	}
	if err != nil || got.State != inventory.OrderCancelled {
		t.Errorf("a cancel whose COMMIT landed but whose answer was lost at the deadline answered %q, %v; the row says cancelled (unit returned), so the lookup that resolves a lost answer should say 200 cancelled",
			got.State, err)
	}
	checkAudit(t, svc, "lost", 1)
}

// ---------------------------------------------------------------------------
// Liveness: the sweep's locks on MariaDB.

// TestSweepDoesNotDeadlockWithAnOrder (MariaDB): the sweep's SELECT … FOR
// UPDATE SKIP LOCKED scans orders_held_expiry_idx (state, expires_at) under
// REPEATABLE READ and, having found fewer lapsed holds than its batch,
// next-key-locks the entry after them: with no unlapsed hold left, the
// index's supremum (INNODB_LOCKS: X on "supremum pseudo-record"), i.e. the
// gap where every new hold's entry (held, now + TTL) goes, of every SKU.
// Every new hold then waits for the sweep's transaction, and one that
// holds the stock row the sweep returns to closes a cycle:
//
//	P (PlaceOrder, gap): UPDATE stock … WHERE sku = 'gap' (row locked)
//	S (sweep):           SELECT … FOR UPDATE SKIP LOCKED (o1, and the supremum)
//	                     UPDATE orders … 'expired'; UPDATE stock … 'gap' waits for P
//	P:                   INSERT INTO orders (… 'held', now + 1h) waits for S
//
// InnoDB kills P as a deadlock and the service runs it again (a retry and a
// backoff per order that meets a sweep; a sweep that weighs less than the
// order is killed instead, and ExpireHolds does not retry). Want: no
// transaction aborted, as on PostgreSQL.
func TestSweepDoesNotDeadlockWithAnOrder(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 4)
			g := newGate(t)
			h := &hooks{beforeInsertOrder: func(ctx context.Context, tx inventory.Tx, o inventory.Order) {
				if o.UserID == "late" {
					g.stop(ctx, t, tx)
				}
			}}
			obs := &retries{}
			svc := sales.NewService(hookedStore{db, h}, sqlrow.NewConditional(), sales.WithObserver(obs),
				sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "gap", 5); err != nil {
				t.Fatal(err)
			}
			o1 := place(t, svc, "gap", "early", 1)
			raw.lapse(t, o1.ID)

			placed := async(func() (inventory.Order, int, error) {
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "gap", Quantity: 1, UserID: "late"})
				return o, 0, err
			})
			placer := g.wait(t) // P holds the stock row, its INSERT not sent
			swept := async(func() (inventory.Order, int, error) {
				n, err := svc.ExpireHolds(ctx, 0)
				return inventory.Order{}, n, err
			})
			raw.waitBlockedBy(t, placer, 1) // S waits for P's stock row
			g.open()

			p, s := await(t, placed, "the order"), await(t, swept, "the sweep")
			if p.err != nil {
				t.Errorf("the order answered %v", p.err)
			}
			if n := obs.count(); len(n) > 0 {
				t.Errorf("transactions run again: %v; want none (an order and the sweep deadlocked)", n)
			}
			if s.err != nil || s.n != 1 {
				t.Errorf("the sweep expired %d and answered %v; want 1, nil", s.n, s.err)
			}
			checkAudit(t, svc, "gap", 5)
		})
	}
}

// TestSweepHoldsUpNoPayOfAnUnlapsedHold (MariaDB): a sweep batch
// transaction is open (it expired the lapsed hold of SKU x and is on its
// way to x's stock row, which may be queued behind a hot row's orders for
// seconds). A buyer pays a hold of SKU y that still runs for an hour. The
// pay's first step is the lazy expiry, UPDATE orders … WHERE id = ? AND
// user_id = ? AND state = 'held' AND expires_at <= UTC_TIMESTAMP(6), and
// MariaDB plans it on orders_held_expiry_idx (state, expires_at), the range
// of lapsed holds, instead of the primary key (INNODB_LOCKS shows it
// waiting for the X lock the sweep holds on x's entry there). So the pay,
// and every GET or cancel of any held order, waits for the sweep, up to its
// lock wait: here 503 busy after 2 s for a valid pay the sweep never
// touches. PostgreSQL pays at once. Want: the pay answers 200 while the
// sweep is open.
func TestSweepHoldsUpNoPayOfAnUnlapsedHold(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 8)
			g := newGate(t)
			h := &hooks{afterExpireLapsed: func(ctx context.Context, tx inventory.Tx, expired []inventory.Order) {
				if len(expired) > 0 {
					g.stop(ctx, t, tx)
				}
			}}
			sweeper := sales.NewService(hookedStore{db, h}, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour))
			// The buyer's request has 2 s, and so does its lock wait.
			svc := sales.NewService(db, sqlrow.NewConditional(),
				sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(2*time.Second))
			ctx := context.Background()
			for _, sku := range []string{"x", "y"} {
				if err := svc.StartSale(ctx, sku, 1); err != nil {
					t.Fatal(err)
				}
			}
			lapsed := place(t, svc, "x", "a", 1)
			raw.lapse(t, lapsed.ID)
			running := place(t, svc, "y", "b", 1)

			swept := async(func() (inventory.Order, int, error) {
				n, err := sweeper.ExpireHolds(ctx, 0)
				return inventory.Order{}, n, err
			})
			g.wait(t) // the sweep expired x's hold; its transaction is open
			paid, err := svc.PayOrder(ctx, running.ID, "b")
			g.open()
			if r := await(t, swept, "the sweep"); r.err != nil || r.n != 1 {
				t.Errorf("the sweep expired %d (%v), want 1", r.n, r.err)
			}
			if err != nil || paid.State != inventory.OrderPaid {
				t.Errorf("a pay of a hold of another SKU with an hour left, during a sweep, answered %q, %v; want 200 paid", paid.State, err)
			}
			checkAudit(t, svc, "y", 1)
		})
	}
}

// ---------------------------------------------------------------------------
// Claim 1, held: one return per order whatever races the sweep.

// TestEveryRacerOfASweptHoldFindsItExpired: sweeper A has expired two
// lapsed holds and stops before returning their units, their rows locked.
// Meanwhile a lazy expiry (GET), a pay and a cancel of each of A's orders
// queue on the rows, and sweeper B runs. Then A returns the units and
// commits. Every racer answers expired, the sweepers expire the four holds
// between them once each, and each unit came back exactly once. (On
// MariaDB B waits for A: see TestSweepHoldsUpNoPayOfAnUnlapsedHold.)
func TestEveryRacerOfASweptHoldFindsItExpired(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 16)
			g := newGate(t)
			var batchA []inventory.Order
			var first sync.Once
			h := &hooks{afterExpireLapsed: func(ctx context.Context, tx inventory.Tx, expired []inventory.Order) {
				if len(expired) > 0 {
					first.Do(func() { batchA = expired })
					g.stop(ctx, t, tx)
				}
			}}
			svc := sales.NewService(hookedStore{db, h}, sqlrow.NewConditional(),
				sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			const initial = 6
			if err := svc.StartSale(ctx, "swept", initial); err != nil {
				t.Fatal(err)
			}
			var orders []inventory.Order
			for i := range 4 {
				o := place(t, svc, "swept", fmt.Sprintf("u%d", i), 1)
				orders = append(orders, o)
				raw.lapse(t, o.ID)
			}
			sweepA := async(func() (inventory.Order, int, error) {
				n, err := svc.ExpireHolds(ctx, 2)
				return inventory.Order{}, n, err
			})
			a := g.wait(t)
			var inA []inventory.Order
			for _, o := range orders {
				for _, e := range batchA {
					if e.ID == o.ID {
						inA = append(inA, o)
					}
				}
			}
			if len(inA) != 2 {
				t.Fatalf("%d orders in sweeper A's batch, want 2", len(inA))
			}
			var racers []chan result
			for _, o := range inA {
				racers = append(racers,
					async(func() (inventory.Order, int, error) { r, err := svc.FindOrder(ctx, o.ID, o.UserID); return r, 0, err }),
					async(func() (inventory.Order, int, error) { r, err := svc.PayOrder(ctx, o.ID, o.UserID); return r, 0, err }),
					async(func() (inventory.Order, int, error) { r, err := svc.CancelOrder(ctx, o.ID, o.UserID); return r, 0, err }))
			}
			sweepB := async(func() (inventory.Order, int, error) {
				n, err := svc.ExpireHolds(ctx, 0)
				return inventory.Order{}, n, err
			})
			raw.waitBlockedBy(t, a, len(racers))
			g.open()
			ra, rb := await(t, sweepA, "sweeper A"), await(t, sweepB, "sweeper B")
			t.Logf("sweeper A expired %d (%v), sweeper B %d (%v)", ra.n, ra.err, rb.n, rb.err)
			for _, r := range []result{ra, rb} {
				if r.err != nil && !errors.Is(r.err, inventory.ErrBusy) {
					t.Errorf("a sweeper answered %v", r.err)
				}
			}
			for i, ch := range racers {
				r := await(t, ch, "a racer")
				switch i % 3 {
				case 0:
					if r.err != nil || r.order.State != inventory.OrderExpired {
						t.Errorf("GET of a swept hold: %q, %v; want expired", r.order.State, r.err)
					}
				default:
					if !errors.Is(r.err, inventory.ErrOrderExpired) {
						t.Errorf("pay/cancel of a swept hold: %q, %v; want 409 expired", r.order.State, r.err)
					}
				}
			}
			// Whatever a sweeper lost to a deadlock, the next sweep takes.
			n, err := svc.ExpireHolds(ctx, 0)
			if err != nil || ra.n+rb.n+n != 4 {
				t.Errorf("the sweeps expired %d+%d+%d holds (%v), want 4 in all, each once", ra.n, rb.n, n, err)
			}
			audit := checkAudit(t, svc, "swept", initial)
			if audit.Available != initial || audit.Expired != 4 || audit.Returned != 4 {
				t.Errorf("audit %+v: want all %d units back, 4 expired, each returned once", audit, initial)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// Claim 5, held: a new sale racing a cancel.

// TestNewSaleRacingACancelKeepsTheOldUnitOut: the cancel has moved its
// order to cancelled (the order row locked) and stops before returning the
// unit; StartSale resets the stock row (locked) and its DELETE of the
// orders waits for the cancel's row; the cancel's return then waits for
// the stock row: a deadlock, whose victim runs again. Whichever wins, the
// new sale has exactly its n units and no order of the old one.
func TestNewSaleRacingACancelKeepsTheOldUnitOut(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 8)
			g := newGate(t)
			h := &hooks{afterSettle: func(ctx context.Context, tx inventory.Tx, id, to string, moved bool) {
				if to == inventory.OrderCancelled && moved {
					g.stop(ctx, t, tx)
				}
			}}
			svc := sales.NewService(hookedStore{db, h}, sqlrow.NewConditional(),
				sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "resale", 3); err != nil {
				t.Fatal(err)
			}
			o := place(t, svc, "resale", "u", 2)
			cancelled := async(func() (inventory.Order, int, error) {
				r, err := svc.CancelOrder(ctx, o.ID, "u")
				return r, 0, err
			})
			c := g.wait(t)
			sale := async(func() (inventory.Order, int, error) {
				return inventory.Order{}, 0, svc.StartSale(ctx, "resale", 7)
			})
			raw.waitBlockedBy(t, c, 1) // StartSale's DELETE waits for the order row
			g.open()
			if r := await(t, sale, "the new sale"); r.err != nil {
				t.Errorf("StartSale: %v", r.err)
			}
			r := await(t, cancelled, "the cancel")
			if r.err != nil && !errors.Is(r.err, inventory.ErrOrderNotFound) {
				t.Errorf("the cancel answered %v; want cancelled or not found", r.err)
			}
			audit := checkAudit(t, svc, "resale", 7)
			if audit.Available != 7 || audit.Orders != 0 || audit.Returned != 0 {
				t.Errorf("audit %+v: want the new sale's 7 units and nothing of the old one", audit)
			}
			t.Logf("cancel answered %q, %v", r.order.State, r.err)
		})
	}
}

// ---------------------------------------------------------------------------
// Claim 3, held: a return inside a read-check-write window.

// TestReturnInsideACompareAndSetWindowTakesNothingTwice: one unit left,
// one held. A version-cas order reads (available 1, version v) and stops
// before its UPDATE … WHERE version = v. The holder cancels: the unit comes
// back (available 2) and the version stays v. The stopped compare-and-set
// then applies (available = available − 1 = 1, relative), another buyer
// takes the last unit, and the next is sold out: a return inside the
// read-check-write window neither lets it take what is not there nor
// loses the returned unit.
func TestReturnInsideACompareAndSetWindowTakesNothingTwice(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, _ := dbWithRawAccess(t, engine, 8)
			g := newGate(t)
			h := &hooks{afterReadLevel: func(ctx context.Context, tx inventory.Tx, l inventory.Level) {
				if l.Available == 1 {
					g.stop(ctx, t, tx)
				}
			}}
			cas := sales.NewService(hookedStore{db, h}, sqlrow.NewVersionCAS(), sales.WithHoldTTL(time.Hour),
				sales.WithOrderTimeout(30*time.Second))
			other := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour))
			ctx := context.Background()
			if err := other.StartSale(ctx, "cas", 2); err != nil {
				t.Fatal(err)
			}
			first := place(t, other, "cas", "first", 1)
			stopped := async(func() (inventory.Order, int, error) {
				o, err := cas.PlaceOrder(ctx, inventory.Request{SKU: "cas", Quantity: 1, UserID: "cas"})
				return o, 0, err
			})
			g.wait(t) // it read 1 unit at version v
			before, err := db.Level(ctx, "cas")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.CancelOrder(ctx, first.ID, "first"); err != nil {
				t.Fatal(err)
			}
			after, err := db.Level(ctx, "cas")
			if err != nil {
				t.Fatal(err)
			}
			if after.Version != before.Version || after.Available != before.Available+1 {
				t.Fatalf("the return moved the row from %+v to %+v; want one unit more, the same version", before, after)
			}
			g.open()
			if r := await(t, stopped, "the compare-and-set order"); r.err != nil {
				t.Errorf("the compare-and-set order answered %v", r.err)
			}
			place(t, other, "cas", "last", 1)
			if _, err := other.PlaceOrder(ctx, inventory.Request{SKU: "cas", Quantity: 1, UserID: "after"}); !errors.Is(err, inventory.ErrSoldOut) {
				t.Errorf("an order after every unit was taken: %v, want sold out", err)
			}
			a := checkAudit(t, other, "cas", 2)
			if a.Available != 0 || a.Held != 2 || a.Cancelled != 1 || a.Returned != 1 {
				t.Errorf("audit %+v: want both units held again, the cancelled one returned once", a)
			}
		})
	}
}
