// Package mysql stores inventory in MySQL or MariaDB (InnoDB) through
// go-sql-driver/mysql. Its SQL is written for MySQL alone; internal/postgres
// has its own.
package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/mysqlconn"
	schema "github.com/flashsale/stock/sql"
)

// Store is an inventory.Store over a database/sql pool.
type Store struct {
	db *sql.DB
	// routes, on a Galera cluster (several hosts in the URL), are a pool
	// per node, in address order (see WithAffinityRouting). Nil on one
	// server.
	routes []*route
	// lockWait is WithLockWaitTimeout's bound, 0 when unset.
	lockWait time.Duration
	// lockWaitOf maps a driver connection to the innodb_lock_wait_timeout
	// it was last given (see beginTx); lockWaitSessions counts its entries.
	lockWaitOf       sync.Map
	lockWaitSessions atomic.Int64
}

var (
	_ inventory.Store = (*Store)(nil)
	_ inventory.Tx    = (*tx)(nil)
	_ batched.Store   = (*Store)(nil)
	_ batched.Tx      = (*tx)(nil)
)

// Option configures Open.
type Option func(*options)

type options struct {
	maxConns        int
	lockWaitTimeout time.Duration
	noRouting       bool
}

// WithAffinityRouting sets whether, on a Galera cluster (a URL naming
// several hosts), each transaction goes through the node its context's
// affinity (inventory.WithAffinity: an order's SKU, a batch's lane) hashes
// to, among the nodes in address order, so that every instance sends one
// SKU's writes through the same node: they queue on the row's lock there
// instead of failing certification against another node's, which rolled
// back most of batched's batches with an instance writing through each
// node (0.31x the single server's burst, against 0.76x through one node).
// A node whose pool cannot begin a transaction passes its share to the
// next for a while (routing.go). Work without
// an affinity, and every read outside a transaction, goes through the
// URL's first node that serves. Each node's pool holds up to
// WithMaxConns connections (see Connections). Default true; no effect on
// one server.
func WithAffinityRouting(on bool) Option {
	return func(o *options) { o.noRouting = !on }
}

// WithMaxConns sets the size of the connection pool. Default 16.
func WithMaxConns(n int) Option {
	return func(o *options) { o.maxConns = n }
}

// WithLockWaitTimeout bounds how long a statement waits for a row lock
// (InnoDB's innodb_lock_wait_timeout, whole seconds, at least 1) before it
// fails with error 1205, answered busy. A client frozen in the middle of an
// order would otherwise hold up every later order on the row for the
// server's 50 s. A transaction begun under a deadline waits at most the time
// it has left, whichever is shorter. Default 0: a transaction without a
// deadline waits up to 20 s (noDeadlineLockWait).
func WithLockWaitTimeout(d time.Duration) Option {
	return func(o *options) { o.lockWaitTimeout = d }
}

// noDeadlineLockWait bounds the row-lock waits of a transaction without a
// deadline when WithLockWaitTimeout is not set: below the driver's I/O
// timeouts (dburl.MySQLIOTimeout), so the
// answer is InnoDB's 1205, not a connection cut mid-statement.
const noDeadlineLockWait = 20 * time.Second

// Open connects to the database at url (mysql://user:pass@host:port/db) and
// checks that it answers.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	cfg, hosts, err := dburl.MySQLNodes(url)
	if err != nil {
		return nil, err
	}
	o := options{maxConns: 16}
	for _, opt := range opts {
		opt(&o)
	}
	if o.lockWaitTimeout > 0 {
		if cfg.Params == nil {
			cfg.Params = map[string]string{}
		}
		// The driver sets unknown DSN parameters as session variables.
		cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(max(1, int(o.lockWaitTimeout.Round(time.Second)/time.Second)))
	}
	s := &Store{lockWait: o.lockWaitTimeout}
	connector, err := connectorOf(cfg, hosts)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	s.db = newPool(connector, o.maxConns)
	if len(hosts) > 1 && !o.noRouting {
		if err := s.openRoutes(cfg, hosts, o.maxConns); err != nil {
			s.Close()
			return nil, fmt.Errorf("mysql: %w", err)
		}
	}
	if err := s.db.PingContext(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("mysql: cannot reach %s: %w", cfg.Addr, wrap(ctx, err))
	}
	return s, nil
}

// newPool is a pool of at most maxConns connections from connector.
func newPool(connector driver.Connector, maxConns int) *sql.DB {
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	// A server restart leaves dead connections in the pool; recycling them
	// bounds how long a stale one can linger.
	db.SetConnMaxLifetime(5 * time.Minute)
	return db
}

// connectorOf is the connector of cfg's database: on its one host, or on
// the nodes of a Galera cluster when the URL names several (mysqlconn).
func connectorOf(cfg *mysql.Config, hosts []string) (driver.Connector, error) {
	if len(hosts) > 1 {
		return mysqlconn.New(cfg, hosts)
	}
	return mysql.NewConnector(cfg)
}

// Close closes the pools.
func (s *Store) Close() {
	_ = s.db.Close()
	for _, r := range s.routes {
		_ = r.db.Close()
	}
}

// Migrate applies the embedded migrations in sql/mysql. A lock table keeps
// instances that start together from migrating at once.
func (s *Store) Migrate(ctx context.Context) error {
	locker, err := lock.NewMySQLTableLocker()
	if err != nil {
		return fmt.Errorf("mysql: migration lock: %w", err)
	}
	// Instances that start together on the nodes of a Galera cluster can
	// meet half-way: one found the version table another had just created
	// and not yet given its first row ("missing zero version migration":
	// the demo's failover run had an instance exit so). Each migration is
	// recorded by its version, so an attempt that failed is made again, on
	// a new provider (goose checks the version table once per provider):
	// up to migrateAttempts, from 250 ms apart, doubling.
	for attempt := range migrateAttempts {
		if err = s.migrateOnce(ctx, locker); err == nil || ctx.Err() != nil || attempt == migrateAttempts-1 {
			break
		}
		if perr := inventory.Pause(ctx, backoff.Exponential(attempt, 250*time.Millisecond, 2*time.Second)); perr != nil {
			break
		}
	}
	return err
}

// migrateAttempts bounds Migrate's attempts.
const migrateAttempts = 4

func (s *Store) migrateOnce(ctx context.Context, locker lock.Locker) error {
	provider, err := goose.NewProvider(goose.DialectMySQL, s.db, schema.MySQLFS(), goose.WithLocker(locker))
	if err != nil {
		return fmt.Errorf("mysql: migrations: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("mysql: migrate: %w", err)
	}
	return nil
}

// Ping implements inventory.Store.
func (s *Store) Ping(ctx context.Context) error {
	return wrap(ctx, s.db.PingContext(ctx))
}

// InTx implements inventory.Store. The transaction's row-lock waits are
// bounded by the time ctx has left (innodb_lock_wait_timeout, whole seconds
// rounded up): when the client gives up, the driver closes the connection,
// but a session queued on a row lock would not notice until the server's
// own timeout (50 s by default) and would keep its place in the queue.
//
// Rollback takes no context in database/sql. When ctx ends, database/sql
// rolls the transaction back by itself and discards the connection (the
// server then aborts the transaction and frees its locks); otherwise the
// deferred Rollback below is bounded by the driver's I/O timeouts.
func (s *Store) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error { return fn(ctx, t) })
}

// InBatchTx implements batched.Store: a transaction as InTx's.
func (s *Store) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error { return fn(ctx, t) })
}

func (s *Store) inTx(ctx context.Context, fn func(context.Context, *tx) error) error {
	sqltx, done, err := s.beginTx(ctx, nil)
	if err != nil {
		return wrap(ctx, err)
	}
	var commitErr error
	// Rollback after a commit is a no-op (sql.ErrTxDone).
	defer func() { done(commitErr) }()
	if err := fn(ctx, &tx{tx: sqltx}); err != nil {
		return err
	}
	if commitErr = sqltx.Commit(); commitErr != nil {
		return wrapCommit(ctx, commitErr)
	}
	return nil
}

// Level implements inventory.Store.
func (s *Store) Level(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, s.db, sku, levelQuery)
}

// SKUsAfter lists, in order, at most limit SKUs that have a stock row (a
// sale was started) and sort after after ("" for the first).
func (s *Store) SKUsAfter(ctx context.Context, after string, limit int) ([]string, error) {
	return s.queryStrings(ctx, `SELECT sku FROM stock WHERE sku > ? ORDER BY sku LIMIT ?`, after, limit)
}

// queryStrings runs a query of one string column.
func (s *Store) queryStrings(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	var found []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, wrap(ctx, err)
		}
		found = append(found, v)
	}
	return found, wrap(ctx, rows.Err())
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
// row with its window (NULL for an open bound; DATETIME in UTC, as
// UTC_TIMESTAMP(6) compares it) and its number (sale_epoch: the next
// multiple of 2^20, so that the sale can be renumbered, RecheckSale adds
// one, and still be told from the next; above st.AtLeast, a number the
// reservation store has seen already), its orders, buyers, restocks and
// order keys forgotten, st.Key recorded, in one transaction;
// st.BeforeCommit runs last, the row locked. A commit whose answer was
// lost is inventory.ErrOutcomeUnknown.
func (s *Store) StartSaleWith(ctx context.Context, st inventory.SaleStart) (int64, error) {
	var epoch int64
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		tx := t.tx
		start, end := utcOrNull(st.Window.StartsAt), utcOrNull(st.Window.EndsAt)
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO stock (sku, initial, available, version, fence, sale_epoch, updated_at, starts_at, ends_at)
			VALUES (?, ?, ?, 0, 0, (? DIV 1048576 + 1) * 1048576, CURRENT_TIMESTAMP(6), ?, ?)
			ON DUPLICATE KEY UPDATE
				initial = ?, available = ?, restocked = 0, version = version + 1,
				sale_epoch = (GREATEST(sale_epoch, ?) DIV 1048576 + 1) * 1048576, updated_at = CURRENT_TIMESTAMP(6),
				starts_at = ?, ends_at = ?`,
			st.SKU, st.Available, st.Available, st.AtLeast, start, end, st.Available, st.Available, st.AtLeast, start, end); err != nil {
			return wrap(ctx, err)
		}
		// The row is locked by the upsert until the commit: this reads
		// the number this transaction wrote.
		if err := tx.QueryRowContext(ctx, `SELECT sale_epoch FROM stock WHERE sku = ?`, st.SKU).Scan(&epoch); err != nil {
			return wrap(ctx, err)
		}
		for _, table := range []string{"orders", "buyer_units", "restocks", "idempotency_keys"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE sku = ?`, st.SKU); err != nil {
				return wrap(ctx, err)
			}
		}
		return wrap(ctx, st.Finish(ctx, t, epoch))
	})
	return epoch, err
}

// Audit implements inventory.Store. Both reads see one snapshot (REPEATABLE
// READ, established by the first read), so a sale in progress still adds up.
func (s *Store) Audit(ctx context.Context, sku string) (inventory.Audit, error) {
	a := inventory.Audit{SKU: sku}
	opts := &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	err := s.inSQLTx(ctx, opts, func(tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx, `SELECT initial, restocked, available, sale_epoch FROM stock WHERE sku = ?`, sku).Scan(&a.Initial, &a.Restocked, &a.Available, &a.Sale)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
		}
		if err != nil {
			return err
		}
		if err := tx.QueryRowContext(ctx, `
			SELECT COALESCE(SUM(IF(state IN ('final', 'held', 'paid'), quantity, 0)), 0),
			       COALESCE(SUM(state IN ('final', 'held', 'paid')), 0),
			       COALESCE(SUM(IF(state = 'held', quantity, 0)), 0),
			       COALESCE(SUM(IF(state IN ('final', 'paid'), quantity, 0)), 0),
			       COALESCE(SUM(IF(state IN ('cancelled', 'expired'), quantity, 0)), 0),
			       COALESCE(SUM(state = 'cancelled'), 0),
			       COALESCE(SUM(state = 'expired'), 0),
			       COALESCE(SUM(IF(relay_pending, quantity, 0)), 0)
			         + (SELECT COALESCE(SUM(quantity), 0) FROM restocks WHERE sku = ? AND relay_pending),
			       COALESCE(SUM(relay_pending), 0)
			FROM orders WHERE sku = ?`, sku, sku).Scan(&a.Ordered, &a.Orders, &a.Held, &a.Paid, &a.Returned, &a.Cancelled, &a.Expired, &a.Relaying, &a.RelayingOrders); err != nil {
			return err
		}
		a.Restocks, err = listRestocks(ctx, tx, sku)
		return err
	})
	return a, wrap(ctx, err)
}

// FindOrder implements inventory.Store.
func (s *Store) FindOrder(ctx context.Context, id string) (inventory.Order, bool, error) {
	o, err := getOrder(ctx, s.db, id)
	if errors.Is(err, sql.ErrNoRows) {
		return inventory.Order{}, false, nil
	}
	if err != nil {
		return inventory.Order{}, false, wrap(ctx, err)
	}
	return o, true, nil
}

// inSQLTx runs fn in a transaction of the admin paths, which need no
// inventory.Tx.
func (s *Store) inSQLTx(ctx context.Context, opts *sql.TxOptions, fn func(*sql.Tx) error) error {
	tx, done, err := s.beginTx(ctx, opts)
	if err != nil {
		return err
	}
	var commitErr error
	defer func() { done(commitErr) }()
	if err := fn(tx); err != nil {
		return err
	}
	commitErr = tx.Commit()
	return commitErr
}

// beginTx begins a transaction on a connection whose row-lock wait is
// lockWaitSeconds, and returns the function that ends it, given the
// commit's error (nil when it committed or did not try): a rollback (a
// no-op after a commit) and the connection back to the pool, or closed
// when the transaction may still be open on it.
//
// The setting is a session variable, so it outlives the transaction; each
// connection's current value is remembered and SET only when it changes.
// (Setting it on every transaction would add a fifth round trip to an
// order's four: BEGIN, UPDATE, INSERT, COMMIT.)
func (s *Store) beginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, func(commitErr error), error) {
	routes := s.routesFor(ctx)
	if routes == nil {
		return s.beginOn(ctx, s.db, opts)
	}
	var err error
	for _, r := range routes {
		var (
			sqltx *sql.Tx
			done  func(error)
		)
		if sqltx, done, err = s.beginOn(ctx, r.db, opts); err == nil {
			return sqltx, done, nil
		}
		if ctx.Err() != nil {
			break
		}
		r.passOver()
	}
	return nil, nil, err
}

// beginOn is beginTx on db's connections.
func (s *Store) beginOn(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, func(commitErr error), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	want := s.lockWaitSeconds(ctx)
	var session any
	_ = conn.Raw(func(driverConn any) error { session = driverConn; return nil })
	if have, ok := s.lockWaitOf.Load(session); !ok || have.(int) != want {
		// An integer, formatted here: no placeholder, so it is one
		// statement whether or not the URL interpolates parameters.
		if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = "+strconv.Itoa(want)); err != nil {
			discard(conn)
			return nil, nil, err
		}
		s.rememberLockWait(session, want)
	}
	sqltx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		discard(conn)
		return nil, nil, err
	}
	return sqltx, func(commitErr error) {
		rollbackErr := sqltx.Rollback()
		// The transaction may still be open on the connection, and the
		// next BEGIN there would commit it, when the server refused the
		// rollback (a Galera node that left the majority answers every
		// statement 1047), refused the commit with anything but a known
		// rollback (database/sql keeps the connection after a failed
		// Commit), or the context ended first (database/sql then rolled
		// back by itself, and keeps the connection whatever the server
		// answered). Such a connection is closed, not pooled (found by
		// review).
		if rollbackErr != nil && !errors.Is(rollbackErr, sql.ErrTxDone) || commitErr != nil && !rolledBackAtCommit(commitErr) || ctx.Err() != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}, nil
}

// discard closes conn instead of pooling it. A connection whose SET or
// BEGIN failed is seldom worth keeping: on a Galera node that left the
// primary component every statement fails (1047) until the node rejoins,
// and pooled, the connection failed every transaction that took it for as
// long, while a new one goes to a node that serves (mysqlconn), or the
// transaction to the next node (routing.go; found by review: with a SKU's
// transactions sent to one node, that node's pooled connections failed
// its SKUs on every instance).
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// rolledBackAtCommit: err, from COMMIT, says the transaction was rolled
// back (a deadlock, a failed certification, a changed snapshot) or never
// reached the server.
func rolledBackAtCommit(err error) bool {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		return myErr.Number == erLockDeadlock || myErr.Number == erCheckRead
	}
	return errors.Is(err, driver.ErrBadConn)
}

// rememberLockWait records a session's row-lock wait. The record keeps the
// driver connection alive, so its address cannot be reused by another; the
// records of connections the pool has closed since are dropped wholesale
// once there are many (which only costs a SET again).
func (s *Store) rememberLockWait(session any, seconds int) {
	if _, loaded := s.lockWaitOf.Swap(session, seconds); !loaded && s.lockWaitSessions.Add(1) > maxRememberedSessions {
		s.lockWaitOf.Clear()
		s.lockWaitSessions.Store(0)
	}
}

// maxRememberedSessions bounds rememberLockWait's records.
const maxRememberedSessions = 4096

// lockWaitSeconds is how long a statement of a transaction begun under ctx
// may wait for a row lock: the time ctx has left, rounded up to whole
// seconds (InnoDB's unit) and at least 1, and at most WithLockWaitTimeout's
// bound when set; without a deadline, that bound or noDeadlineLockWait.
func (s *Store) lockWaitSeconds(ctx context.Context) int {
	bound := s.lockWait
	if bound <= 0 {
		bound = noDeadlineLockWait
	}
	if deadline, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(deadline))
	}
	return max(1, int((bound+time.Second-1)/time.Second))
}

// MySQL error numbers the service acts on.
const (
	erLockWaitTimeout   = 1205
	erLockDeadlock      = 1213
	erDuplicateKey      = 1062
	erCheckRead         = 1020 // MariaDB innodb_snapshot_isolation: the row changed since the snapshot
	erTooManyConns      = 1040
	erServerShutdown    = 1053
	erWsrepNotReady     = 1047 // a Galera node outside the primary component: ER_UNKNOWN_COM_ERROR
	erQueryInterrupted  = 1317
	erMaxExecTimeExceed = 3024 // MySQL 8 max_execution_time
	erStatementTimeout  = 1969 // MariaDB max_statement_time
)

// wrap files a MySQL error under the inventory error the service acts on,
// keeping the original as the cause.
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
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) {
		switch myErr.Number {
		case erLockDeadlock:
			// InnoDB rolled back the transaction, so it may run again.
			return fmt.Errorf("%w: %w", inventory.ErrConflict, err)
		case erCheckRead:
			// With innodb_snapshot_isolation=ON (MariaDB's default from
			// 11.6.2) a write to a row changed since the transaction's
			// snapshot fails instead of matching no row. The transaction
			// is rolled back and runs again with a fresh snapshot, which
			// is what a 0-row version check leads to as well.
			return fmt.Errorf("%w: %w", inventory.ErrConflict, err)
		case erLockWaitTimeout, erQueryInterrupted, erMaxExecTimeExceed, erStatementTimeout:
			// The wait was bounded by the order's deadline (or the bound
			// on a stuck holder): running it again would only wait past
			// that. Busy; the client may retry.
			return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
		case erTooManyConns, erServerShutdown, erWsrepNotReady:
			return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
		}
		return fmt.Errorf("mysql: %w", err)
	}
	// Anything else on the way to the server (refused, reset, bad
	// connection) means the database is out of reach.
	return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
}

// wrapCommit files a commit error. The server's deadlock (1213) or
// changed-snapshot (1020) refusal means the transaction was rolled back,
// and so does driver.ErrBadConn (the driver
// returns it only when nothing was sent). So do sql.ErrTxDone and the
// context's own error: database/sql returns them without sending COMMIT when
// the transaction's context ended, and rolls the transaction back itself.
// Any other failure leaves the outcome unknown.
func wrapCommit(ctx context.Context, err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) && !rolledBackAtCommit(err) {
		// Only a deadlock (on Galera, a failed certification) and a
		// changed snapshot are known to roll back at COMMIT. Any other
		// refusal there may come after the write set left for the
		// cluster (1047: the node left the majority while it was
		// certified; 1180: the replication failed): the rest of the
		// cluster may have committed it (found by review).
		return fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
	}
	if errors.As(err, &myErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrTxDone) ||
		ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return wrap(ctx, err)
	}
	return fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
}
