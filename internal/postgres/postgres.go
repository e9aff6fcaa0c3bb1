// Package postgres stores inventory in PostgreSQL through pgx/v5. Its SQL is
// written for PostgreSQL alone; internal/mysql has its own.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	schema "github.com/flashsale/stock/sql"
)

// Store is an inventory.Store over a pgx pool.
type Store struct {
	pool *pgxpool.Pool
	// unreplicated marks the connections whose last COMMIT's wait for the
	// synchronous standby was cancelled (syncRepCancelled).
	unreplicated sync.Map // *pgconn.PgConn → struct{}
}

var (
	_ inventory.Store = (*Store)(nil)
	_ inventory.Tx    = (*tx)(nil)
	_ batched.Store   = (*Store)(nil)
	_ batched.Tx      = (*tx)(nil)
)

// Option configures Open.
type Option func(*pgxpool.Config)

// WithMaxConns sets the size of the connection pool. Default 16: enough to
// keep a hot row busy, and three instances stay well under PostgreSQL's
// default max_connections of 100.
func WithMaxConns(n int32) Option {
	return func(c *pgxpool.Config) { c.MaxConns = n }
}

// WithIdleInTransactionTimeout makes the server end a session that sits
// idle inside a transaction for longer than d (PostgreSQL's
// idle_in_transaction_session_timeout), releasing its row locks. A client
// frozen in the middle of an order (a stopped process, a long pause) would
// otherwise block every later order on the row until it wakes. Default 0:
// the server's setting.
func WithIdleInTransactionTimeout(d time.Duration) Option {
	return func(c *pgxpool.Config) {
		if d > 0 {
			c.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(d.Milliseconds(), 10)
		}
	}
}

// Open connects to the database at url (postgres:// or postgresql://) and
// checks that it answers.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DATABASE_URL: %w", err)
	}
	cfg.MaxConns = 16
	for _, o := range opts {
		o(cfg)
	}
	s := &Store{}
	cfg.ConnConfig.OnNotice = func(c *pgconn.PgConn, n *pgconn.Notice) {
		if syncRepCancelled(n) {
			s.unreplicated.Store(c, struct{}{})
		}
	}
	// A mark an autocommit write left on a connection goes with it.
	cfg.BeforeClose = func(c *pgx.Conn) { s.unreplicated.Delete(c.PgConn()) }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: cannot reach %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, wrap(ctx, err))
	}
	s.pool = pool
	return s, nil
}

// syncRepCancelled is the warning of a COMMIT whose wait for its
// synchronous standby was cancelled (pg_cancel_backend, a
// statement_timeout, a shutdown): the transaction is committed on the
// primary, visible there, and maybe on no standby, yet the COMMIT returns
// no error. PostgreSQL gives it no code of its own (01000), so it is known
// by its text, as the server writes it with lc_messages in English (the
// default, C); another language loses this guard, not the others
// (commitQuery).
func syncRepCancelled(n *pgconn.Notice) bool {
	return strings.Contains(n.Message, "synchronous replication") || strings.Contains(n.Detail, "might not have been replicated")
}

// Close closes the pool.
func (s *Store) Close() { s.pool.Close() }

// Migrate applies the embedded migrations in sql/postgres. An advisory lock
// on the schema keeps instances that start together from migrating at once.
func (s *Store) Migrate(ctx context.Context) error {
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	// The lock is per schema: goose's default id is one for the whole
	// database, so services (and tests) in other schemas of the same
	// database would queue behind each other's migrations, 5 s a retry.
	var schemaName string
	if err := s.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&schemaName); err != nil {
		return fmt.Errorf("postgres: migration lock: %w", wrap(ctx, err))
	}
	id := fnv.New64a()
	_, _ = id.Write([]byte("stock migrations " + schemaName))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(id.Sum64())), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("postgres: migration lock: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, schema.PostgresFS(), goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("postgres: migrations: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	return nil
}

// Ping implements inventory.Store.
func (s *Store) Ping(ctx context.Context) error {
	return wrap(ctx, s.pool.Ping(ctx))
}

// rollbackTimeout bounds a rollback, which runs even when the order's own
// deadline has passed: a cancelled order must still release its row locks.
const rollbackTimeout = 2 * time.Second

// InTx implements inventory.Store. A transaction begun under a deadline
// gets the time left as its lock_timeout and statement_timeout: when the
// client gives up (pgx then closes the connection), the server stops waiting
// too, instead of keeping a backend queued on the row, which it would
// otherwise do until the lock came free.
func (s *Store) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error { return fn(ctx, t) })
}

// InBatchTx implements batched.Store: a transaction as InTx's.
func (s *Store) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error { return fn(ctx, t) })
}

func (s *Store) inTx(ctx context.Context, fn func(context.Context, *tx) error) error {
	opts := pgx.TxOptions{BeginQuery: beginQuery(ctx)}
	if opts.BeginQuery != "" {
		opts.CommitQuery = commitQuery
	}
	// The connection is held until the commit's warning has been looked
	// at: pgxpool's own transactions hand it back inside Commit, and
	// another transaction's mark could then be taken for this one's (found
	// by review).
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return wrap(ctx, err)
	}
	defer pc.Release()
	conn := pc.Conn().PgConn()
	// A mark left by anything before (an autocommit write) is not this
	// transaction's.
	s.unreplicated.Delete(conn)
	defer s.unreplicated.Delete(conn)
	pgtx, err := pc.BeginTx(ctx, opts)
	if err != nil {
		return wrap(ctx, err)
	}
	// Rollback after a commit is a no-op; it runs on every other path,
	// under a deadline of its own that a cancelled request cannot cut short.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		_ = pgtx.Rollback(rctx)
	}()
	if err := fn(ctx, &tx{tx: pgtx}); err != nil {
		return err
	}
	if err := pgtx.Commit(ctx); err != nil {
		return wrapCommit(ctx, err)
	}
	if _, cut := s.unreplicated.Load(conn); cut {
		// Answered 201 now, the order could be lost with the primary: the
		// lookup that settles it waits for the standby (its commit too).
		return fmt.Errorf("%w: the commit's wait for the synchronous standby was cancelled: it is on the primary, maybe on no standby", inventory.ErrOutcomeUnknown)
	}
	return nil
}

// commitQuery ends a transaction begun by beginQuery: its COMMIT must not
// be bound by the statement_timeout of its statements. A COMMIT that waits
// for its synchronous standby and is cancelled by that timeout returns as
// done, the transaction committed on the primary only (found by review:
// under Patroni an order could be answered 201 and lost with the primary).
// Without the timeout the wait lasts until the order's deadline, when pgx
// closes the connection: an unknown outcome, settled by a lookup.
const commitQuery = "SET LOCAL statement_timeout = 0; COMMIT"

// beginQuery returns the statement that begins a transaction under ctx's
// deadline: BEGIN, then the time left (whole milliseconds, rounded up, at
// least 1: 0 would mean no limit) as lock_timeout and statement_timeout for
// this transaction only. It is sent as one simple-protocol query, so the
// bound costs no round trip. Without a deadline, "" keeps pgx's plain BEGIN.
func beginQuery(ctx context.Context) string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ""
	}
	ms := max(1, (time.Until(deadline)+time.Millisecond-1)/time.Millisecond)
	return fmt.Sprintf("BEGIN; SET LOCAL lock_timeout = %d; SET LOCAL statement_timeout = %d", ms, ms)
}

// Level implements inventory.Store.
func (s *Store) Level(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, s.pool, sku, levelQuery)
}

// SKUsAfter lists, in order, at most limit SKUs that have a stock row (a
// sale was started) and sort after after ("" for the first).
func (s *Store) SKUsAfter(ctx context.Context, after string, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `SELECT sku FROM stock WHERE sku > $1 ORDER BY sku LIMIT $2`, after, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	skus, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return skus, wrap(ctx, err)
}

// StartSale implements inventory.Store.
func (s *Store) StartSale(ctx context.Context, sku string, n int64) error {
	_, err := s.StartSaleWith(ctx, inventory.SaleStart{SKU: sku, Available: n})
	return err
}

// StartSaleWindow implements inventory.Store.
func (s *Store) StartSaleWindow(ctx context.Context, sku string, n int64, w inventory.SaleWindow) error {
	_, err := s.StartSaleWith(ctx, inventory.SaleStart{SKU: sku, Available: n, Window: w})
	return err
}

// StartSaleWith implements inventory.Store, for every start: the sale's
// row with its window (NULL for an open bound) and its number (sale_epoch:
// the next multiple of 2^20, so that the sale can be renumbered,
// RecheckSale adds one, and still be told from the next; above st.AtLeast,
// a number the reservation store has seen already), its orders, buyers,
// restocks and order keys forgotten, st.Key recorded, in one transaction;
// st.BeforeCommit runs last, the row locked. A commit whose answer was
// lost is inventory.ErrOutcomeUnknown.
func (s *Store) StartSaleWith(ctx context.Context, st inventory.SaleStart) (int64, error) {
	var epoch int64
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		tx := t.tx
		if err := tx.QueryRow(ctx, `
			INSERT INTO stock (sku, initial, available, version, fence, sale_epoch, updated_at, starts_at, ends_at)
			VALUES ($1, $2, $2, 0, 0, ($3::bigint / 1048576 + 1) * 1048576, now(), $4, $5)
			ON CONFLICT (sku) DO UPDATE
			SET initial = $2, available = $2, restocked = 0, version = stock.version + 1,
				sale_epoch = (GREATEST(stock.sale_epoch, $3::bigint) / 1048576 + 1) * 1048576, updated_at = now(),
				starts_at = $4, ends_at = $5
			RETURNING sale_epoch`, st.SKU, st.Available, st.AtLeast, timeOrNull(st.Window.StartsAt), timeOrNull(st.Window.EndsAt)).Scan(&epoch); err != nil {
			return wrap(ctx, err)
		}
		for _, table := range []string{"orders", "buyer_units", "restocks", "idempotency_keys"} {
			if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE sku = $1`, st.SKU); err != nil {
				return wrap(ctx, err)
			}
		}
		return wrap(ctx, st.Finish(ctx, t, epoch))
	})
	return epoch, err
}

// Audit implements inventory.Store. Both reads see one snapshot (REPEATABLE
// READ), so a sale in progress still adds up.
func (s *Store) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	a := inventory.Audit{SKU: sku}
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT initial, restocked, available, sale_epoch FROM stock WHERE sku = $1`, sku).Scan(&a.Initial, &a.Restocked, &a.Available, &a.Sale)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
		}
		if err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `
			SELECT COALESCE(SUM(quantity) FILTER (WHERE state IN ('final', 'held', 'paid')), 0),
			       COUNT(*) FILTER (WHERE state IN ('final', 'held', 'paid')),
			       COALESCE(SUM(quantity) FILTER (WHERE state = 'held'), 0),
			       COALESCE(SUM(quantity) FILTER (WHERE state IN ('final', 'paid')), 0),
			       COALESCE(SUM(quantity) FILTER (WHERE state IN ('cancelled', 'expired')), 0),
			       COUNT(*) FILTER (WHERE state = 'cancelled'),
			       COUNT(*) FILTER (WHERE state = 'expired'),
			       COALESCE(SUM(quantity) FILTER (WHERE relay_pending), 0)
			         + (SELECT COALESCE(SUM(quantity), 0) FROM restocks WHERE sku = $1 AND relay_pending),
			       COUNT(*) FILTER (WHERE relay_pending)
			FROM orders WHERE sku = $1`, sku).Scan(&a.Ordered, &a.Orders, &a.Held, &a.Paid, &a.Returned, &a.Cancelled, &a.Expired, &a.Relaying, &a.RelayingOrders); err != nil {
			return err
		}
		a.Restocks, err = listRestocks(ctx, tx, sku)
		return err
	})
	return a, wrap(ctx, err)
}

// FindOrder implements inventory.Store.
func (s *Store) FindOrder(ctx context.Context, id string) (inventory.Order, bool, error) {
	o, err := getOrder(ctx, s.pool, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return inventory.Order{}, false, nil
	}
	if err != nil {
		return inventory.Order{}, false, wrap(ctx, err)
	}
	return o, true, nil
}

// wrap files a PostgreSQL error under the inventory error the service acts
// on, keeping the original as the cause.
func wrap(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	for _, known := range []error{inventory.ErrUnknownSKU, inventory.ErrBusy, inventory.ErrUnavailable, inventory.ErrConflict} {
		if errors.Is(err, known) {
			return err
		}
	}
	if ctx.Err() != nil {
		// The order's deadline passed (or it was cancelled) while the
		// database worked: a busy answer, whatever the driver made of it.
		return fmt.Errorf("%w: %w", inventory.ErrBusy, errors.Join(context.Cause(ctx), err))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code == "40P01" || pgErr.Code == "40001":
			// deadlock_detected, serialization_failure: the transaction
			// was rolled back and may run again.
			return fmt.Errorf("%w: %w", inventory.ErrConflict, err)
		case pgErr.Code == "55P03" || pgErr.Code == "57014":
			// lock_not_available (lock_timeout), query_canceled
			// (statement_timeout): the order's time ran out at the server.
			return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
		case pgErr.Severity == "FATAL" || pgErr.Code == "25P03" ||
			len(pgErr.Code) >= 2 && (pgErr.Code[:2] == "08" || pgErr.Code[:2] == "53" || pgErr.Code[:2] == "57" || pgErr.Code[:2] == "58"):
			// The server ended the session (idle-in-transaction timeout,
			// shutdown), or connection, resource or system errors.
			return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
		}
		return fmt.Errorf("postgres: %w", err)
	}
	// Anything else on the way to the server (refused, reset, pool closed)
	// means the database is out of reach.
	return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
}

// wrapCommit files a commit error. The server's own refusal means the
// transaction was rolled back; a lost connection leaves the outcome
// unknown, even when pgx calls it safe to retry. A backend waiting for its
// synchronous standby has committed locally already: when it is ended (a
// Patroni demotion, pg_terminate_backend, a shutdown) the server sends only
// the warning "the transaction has already committed locally, but might
// not have been replicated to the standby" and closes the connection, and
// pgx reports "conn closed" with SafeToRetry true, as if the COMMIT had
// never left. Answered as rolled back, an order the promoted standby has
// was told "nothing was deducted"
// (TestACommitEndedWhileWaitingForItsSynchronousStandbyIsNotAnsweredAsRolledBack).
// A connection closed before the COMMIT was sent costs one lookup more.
func wrapCommit(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "25P02" {
			// commitQuery's SET in a transaction that had failed: rolled
			// back, as a bare COMMIT would have answered.
			return wrap(ctx, pgx.ErrTxCommitRollback)
		}
		return wrap(ctx, err)
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed) {
		// Rolled back, or the COMMIT never left this process.
		return wrap(ctx, err)
	}
	return fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
}
