package store_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// sessionRecorder wraps a strategy and reports the server session (backend
// pid, connection id) of each of its transactions.
type sessionRecorder struct {
	inventory.Strategic
	sessions chan int64
}

func (r sessionRecorder) Strategy() inventory.Strategy {
	st := r.Strategic.Strategy()
	st.Deduct = r.deduct(st.Deduct)
	return st
}

func (r sessionRecorder) deduct(inner func(context.Context, string, int64, inventory.TxRunner) error) func(context.Context, string, int64, inventory.TxRunner) error {
	return func(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
		return r.deductRecorded(ctx, sku, quantity, inTx, inner)
	}
}

func (r sessionRecorder) deductRecorded(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner, inner func(context.Context, string, int64, inventory.TxRunner) error) error {
	return inner(ctx, sku, quantity, func(ctx context.Context, deduct func(context.Context, inventory.StockTx) error) error {
		return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
			id, err := tx.(interface {
				SessionID(context.Context) (int64, error)
			}).SessionID(ctx)
			if err != nil {
				return err
			}
			r.sessions <- id
			return deduct(ctx, tx)
		})
	})
}

// lockWaiter asks the server whether a session waits for a lock.
type lockWaiter func(ctx context.Context, session int64) (bool, error)

func postgresLockWaiter(t *testing.T, url string) lockWaiter {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return func(ctx context.Context, pid int64) (bool, error) {
		var waiting bool
		err := conn.QueryRow(ctx, `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, pid).Scan(&waiting)
		return waiting, err
	}
}

func mysqlLockWaiter(t *testing.T, url string) lockWaiter {
	cfg, err := dburl.MySQL(url)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(connector)
	t.Cleanup(func() { _ = db.Close() })
	// The session's thread still runs its statement (the client closed
	// the connection, so the thread ends as soon as the statement does).
	// Not information_schema.innodb_trx: InnoDB refreshes that view only
	// when nobody read it for 100 ms, so parallel pollers can keep it stale
	// indefinitely.
	return func(ctx context.Context, id int64) (bool, error) {
		var waiting bool
		err := db.QueryRowContext(ctx, `
			SELECT EXISTS (SELECT 1 FROM information_schema.processlist
			               WHERE id = ? AND command = 'Query')`, id).Scan(&waiting)
		return waiting, err
	}
}

// TestDeadlineEndsTheServersWait: an order whose row is held by another
// transaction gives up at its deadline (200 ms) with a busy answer, and the
// server stops waiting for the lock on its behalf soon after, instead of
// keeping the session queued on the row until the holder lets go
// (PostgreSQL) or for innodb_lock_wait_timeout's 50 s (MySQL). PostgreSQL
// gets the time left as lock_timeout; MySQL as innodb_lock_wait_timeout in
// whole seconds, so its session waits up to 1 s.
func TestDeadlineEndsTheServersWait(t *testing.T) {
	for _, engine := range store.Engines {
		for name, strategy := range map[string]inventory.Strategic{
			strategies.NameForUpdate:   sqlrow.NewForUpdate(),
			strategies.NameConditional: sqlrow.NewConditional(),
		} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				url := testdb.URL(t, engine)
				ctx := context.Background()
				db, err := store.Open(ctx, url, 4)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(db.Close)
				if err := db.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				if err := db.StartSale(ctx, "s-1", 5); err != nil {
					t.Fatal(err)
				}
				waiting := map[string]func(*testing.T, string) lockWaiter{
					"postgres": postgresLockWaiter, "mysql": mysqlLockWaiter,
				}[engine](t, url)

				testdb.HoldRow(t, db, "s-1")

				rec := sessionRecorder{Strategic: strategy, sessions: make(chan int64, 1)}
				svc := sales.NewService(db, rec, sales.WithOrderTimeout(200*time.Millisecond))
				// The recorder sends the order's session before it asks
				// for the row, so once PlaceOrder returns the session is
				// there, or the order gave up before its transaction got
				// that far (its 200 ms spent on a loaded machine: a
				// receive that waited for it hung the package for 20
				// minutes). Such an attempt says nothing: try again.
				var began time.Time
				var gaveUp time.Duration
				session := int64(-1)
				for attempt := 1; session < 0; attempt++ {
					began = time.Now()
					_, err = svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"})
					gaveUp = time.Since(began)
					if !errors.Is(err, inventory.ErrBusy) {
						t.Errorf("order behind a held row: %v, want busy", err)
					}
					select {
					case session = <-rec.sessions:
					default:
						if attempt == 5 {
							t.Fatalf("5 orders gave up before their transaction reached the row: %v", err)
						}
						t.Logf("attempt %d gave up before its transaction reached the row (%v): again", attempt, err)
					}
				}

				// The server's own timeout is what is under test here, so
				// this waits for it, up to a bound.
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					still, err := waiting(wctx, session)
					if err != nil && wctx.Err() == nil {
						t.Fatalf("ask the server: %v", err)
					}
					if err == nil && !still {
						break
					}
					select {
					case <-tick.C:
					case <-wctx.Done():
						t.Fatalf("session %d still waits for the row %v after its order gave up", session, (time.Since(began) - gaveUp).Round(time.Millisecond))
					}
				}
				t.Logf("the order gave up after %v (%v); the server stopped waiting %v later",
					gaveUp.Round(time.Millisecond), err, (time.Since(began) - gaveUp).Round(time.Millisecond))
			})
		}
	}
}

// TestDeadlineBoundsTheServerAlone: the server itself ends a transaction's
// lock wait at the deadline the transaction began under, even when the
// client's cancellation never reaches it (a lost cancel request, a proxy
// that drops it, a client that froze): the statement here runs without a
// deadline of its own. The timeout is answered busy (PostgreSQL 55P03,
// MySQL 1205), never as an unexplained error.
func TestDeadlineBoundsTheServerAlone(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			ctx := context.Background()
			if err := db.StartSale(ctx, "s-1", 5); err != nil {
				t.Fatal(err)
			}
			release := testdb.HoldRow(t, db, "s-1")

			orderCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			began := time.Now()
			waited := make(chan error, 1)
			go func() {
				waited <- db.InTx(orderCtx, func(ctx context.Context, tx inventory.Tx) error {
					_, err := tx.LockLevel(context.WithoutCancel(ctx), "s-1")
					return err
				})
			}()
			var err error
			select {
			case err = <-waited:
			case <-time.After(5 * time.Second):
				_ = release()
				t.Fatalf("the server still waits %v after the deadline: %v", time.Since(began), <-waited)
			}
			if err := release(); err != nil {
				t.Error(err)
			}
			took := time.Since(began)
			t.Logf("the server ended the wait after %v: %v", took.Round(time.Millisecond), err)
			if !errors.Is(err, inventory.ErrBusy) {
				t.Errorf("lock wait ended by the server: %v, want busy", err)
			}
		})
	}
}

// TestCommitAfterTheDeadlineIsBusy: a transaction whose context ends before
// its COMMIT is sent was rolled back, and says so (busy), instead of
// claiming its outcome unknown, which would send the service looking for an
// order that cannot exist and answer 503 unavailable.
func TestCommitAfterTheDeadlineIsBusy(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 2)
			ctx := context.Background()
			if err := db.StartSale(ctx, "s-1", 5); err != nil {
				t.Fatal(err)
			}
			orderCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			err := db.InTx(orderCtx, func(ctx context.Context, tx inventory.Tx) error {
				if err := tx.Deduct(ctx, "s-1", 1); err != nil {
					return err
				}
				cancel() // the order's time runs out before its commit
				return nil
			})
			if !errors.Is(err, inventory.ErrBusy) || errors.Is(err, inventory.ErrOutcomeUnknown) {
				t.Errorf("commit after the deadline: %v, want busy (rolled back), not an unknown outcome", err)
			}
			if l, err := db.Level(ctx, "s-1"); err != nil || l.Available != 5 {
				t.Errorf("level %+v, %v: want nothing deducted", l, err)
			}
		})
	}
}
