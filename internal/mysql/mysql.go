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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/internal/inventory"
	schema "github.com/flashsale/stock/sql"
)

// Store is an inventory.Store over a database/sql pool.
type Store struct {
	db *sql.DB
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
	cfg, err := dburl.MySQL(url)
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
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(o.maxConns)
	db.SetMaxIdleConns(o.maxConns)
	// A server restart leaves dead connections in the pool; recycling them
	// bounds how long a stale one can linger.
	db.SetConnMaxLifetime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("mysql: cannot reach %s: %w", cfg.Addr, wrap(ctx, err))
	}
	return &Store{db: db, lockWait: o.lockWaitTimeout}, nil
}

// Close closes the pool.
func (s *Store) Close() { _ = s.db.Close() }

// Migrate applies the embedded migrations in sql/mysql. A lock table keeps
// instances that start together from migrating at once.
func (s *Store) Migrate(ctx context.Context) error {
	locker, err := lock.NewMySQLTableLocker()
	if err != nil {
		return fmt.Errorf("mysql: migration lock: %w", err)
	}
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
	// Rollback after a commit is a no-op (sql.ErrTxDone).
	defer done()
	if err := fn(ctx, &tx{tx: sqltx}); err != nil {
		return err
	}
	if err := sqltx.Commit(); err != nil {
		return wrapCommit(ctx, err)
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
	defer done()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// beginTx begins a transaction on a connection whose row-lock wait is
// lockWaitSeconds, and returns the function that ends it: a rollback (a
// no-op after a commit) and the connection back to the pool.
//
// The setting is a session variable, so it outlives the transaction; each
// connection's current value is remembered and SET only when it changes.
// (Setting it on every transaction would add a fifth round trip to an
// order's four: BEGIN, UPDATE, INSERT, COMMIT.)
func (s *Store) beginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, func(), error) {
	conn, err := s.db.Conn(ctx)
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
			_ = conn.Close()
			return nil, nil, err
		}
		s.rememberLockWait(session, want)
	}
	sqltx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return sqltx, func() {
		_ = sqltx.Rollback()
		_ = conn.Close()
	}, nil
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

// querier is what a pool and a transaction have in common.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type tx struct {
	tx *sql.Tx
}

// SessionID returns the server thread of the transaction's connection
// (CONNECTION_ID()), so a test harness can ask the server whether it waits
// on a lock.
func (t *tx) SessionID(ctx context.Context) (int64, error) {
	var id int64
	err := t.tx.QueryRowContext(ctx, `SELECT CONNECTION_ID()`).Scan(&id)
	return id, wrap(ctx, err)
}

func (t *tx) ReadLevel(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, t.tx, sku, levelQuery)
}

func (t *tx) LockLevel(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, t.tx, sku, levelQuery+` FOR UPDATE`)
}

func (t *tx) Deduct(ctx context.Context, sku string, quantity int64) error {
	ok, err := t.execAffected(ctx, `
		UPDATE stock SET available = available - ?, version = version + 1
		WHERE sku = ?`, quantity, sku)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return err
}

func (t *tx) DeductIfVersion(ctx context.Context, sku string, quantity, version int64) (bool, error) {
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - ?, version = version + 1
		WHERE sku = ? AND version = ?`, quantity, sku, version)
}

func (t *tx) DeductIfAvailable(ctx context.Context, sku string, quantity int64) (bool, error) {
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - ?, version = version + 1
		WHERE sku = ? AND available >= ? AND `+openNow, quantity, sku, quantity)
}

func (t *tx) DeductIfFenced(ctx context.Context, sku string, quantity, token, readVersion int64) (bool, error) {
	// InnoDB evaluates an UPDATE's WHERE on the latest committed row (a
	// locking read), not on the transaction's REPEATABLE READ snapshot, so
	// a read that went stale is refused here even inside one transaction.
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - ?, version = version + 1, fence = ?
		WHERE sku = ? AND fence < ? AND version = ?`, quantity, token, sku, token, readVersion)
}

func (t *tx) InsertOrder(ctx context.Context, o inventory.Order) (time.Time, error) {
	// A held order's hold runs from the database's clock, never an
	// instance's (NULL when there is none); its expiry comes back for the
	// order's answer. An expiry given (ExpiresAt, the one its answer
	// promised) is kept when it is the later.
	const insert = `
		INSERT INTO orders (id, sku, quantity, user_id, strategy, state, expires_at, claimed)
		VALUES (?, ?, ?, ?, ?, ?, ` + heldExpiry + `, ?)`
	args := []any{o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy, stateOf(o), o.Hold.Microseconds(), utcOrNull(o.ExpiresAt), o.Hold.Microseconds(), utcOrNull(o.ExpiresAt), o.Claimed}
	if o.Hold <= 0 && o.ExpiresAt.IsZero() {
		_, err := t.tx.ExecContext(ctx, insert, args...)
		return time.Time{}, wrap(ctx, err)
	}
	var expires sql.NullTime
	err := t.tx.QueryRowContext(ctx, insert+` RETURNING expires_at`, args...).Scan(&expires)
	return expires.Time.UTC(), wrap(ctx, err)
}

// heldExpiry is a new order's expires_at, of the arguments hold (µs), the
// expiry given (NULL: none), hold, the expiry given: for a held order the
// later of the database's now + hold and the expiry its answer promised
// (MariaDB's GREATEST is NULL when an argument is), the given expiry (or
// NULL) for a final one.
const heldExpiry = `IF(? > 0, GREATEST(COALESCE(?, '1970-01-01'), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?)`

func (t *tx) GetOrder(ctx context.Context, id string) (inventory.Order, error) {
	o, err := getOrder(ctx, t.tx, id)
	return o, wrap(ctx, err)
}

func (t *tx) FindIdempotency(ctx context.Context, key string) (inventory.IdempotencyRecord, bool, error) {
	r := inventory.IdempotencyRecord{Key: key}
	err := t.tx.QueryRowContext(ctx, `
		SELECT sku, request_hash, order_id FROM idempotency_keys
		WHERE idempotency_key = ?`, key).Scan(&r.SKU, &r.RequestHash, &r.OrderID)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, wrap(ctx, err)
}

func (t *tx) InsertIdempotency(ctx context.Context, r inventory.IdempotencyRecord) (bool, error) {
	// The no-op update waits for a concurrent insert of the same key and
	// then changes no row: the key belongs to the other request. (INSERT
	// IGNORE would also swallow unrelated errors.)
	return t.execAffected(ctx, `
		INSERT INTO idempotency_keys (idempotency_key, sku, request_hash, order_id)
		VALUES (?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key`, r.Key, r.SKU, r.RequestHash, r.OrderID)
}

func (t *tx) FindIdempotencyKeys(ctx context.Context, keys []string) (map[string]inventory.IdempotencyRecord, error) {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	rows, err := t.tx.QueryContext(ctx, `
		SELECT idempotency_key, sku, request_hash, order_id FROM idempotency_keys
		WHERE idempotency_key IN (`+placeholders(len(keys), "?")+`)`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	found := map[string]inventory.IdempotencyRecord{}
	for rows.Next() {
		var r inventory.IdempotencyRecord
		if err := rows.Scan(&r.Key, &r.SKU, &r.RequestHash, &r.OrderID); err != nil {
			return nil, wrap(ctx, err)
		}
		found[r.Key] = r
	}
	return found, wrap(ctx, rows.Err())
}

func (t *tx) InsertOrders(ctx context.Context, orders []inventory.Order) ([]time.Time, error) {
	args := make([]any, 0, 10*len(orders))
	held := false
	for _, o := range orders {
		args = append(args, o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy, stateOf(o), o.Hold.Microseconds(), utcOrNull(o.ExpiresAt), o.Hold.Microseconds(), utcOrNull(o.ExpiresAt), o.Claimed)
		held = held || o.Hold > 0 || !o.ExpiresAt.IsZero()
	}
	insert := `
		INSERT INTO orders (id, sku, quantity, user_id, strategy, state, expires_at, claimed)
		VALUES ` + placeholders(len(orders), "(?, ?, ?, ?, ?, ?, "+heldExpiry+", ?)")
	out := make([]time.Time, len(orders))
	if !held {
		_, err := t.tx.ExecContext(ctx, insert, args...)
		return out, wrap(ctx, err)
	}
	// The held orders' expiries come back for their answers, by id.
	rows, err := t.tx.QueryContext(ctx, insert+` RETURNING id, expires_at`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	byID := make(map[string]time.Time, len(orders))
	for rows.Next() {
		var id string
		var expires sql.NullTime
		if err := rows.Scan(&id, &expires); err != nil {
			return nil, wrap(ctx, err)
		}
		if expires.Valid {
			byID[id] = expires.Time.UTC()
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	for i, o := range orders {
		out[i] = byID[o.ID]
	}
	return out, nil
}

func (t *tx) InsertIdempotencyRecords(ctx context.Context, records []inventory.IdempotencyRecord) (int, error) {
	args := make([]any, 0, 4*len(records))
	for _, r := range records {
		args = append(args, r.Key, r.SKU, r.RequestHash, r.OrderID)
	}
	// As InsertIdempotency: the no-op update waits for concurrent inserts
	// of the same keys and changes no row, so a key another request
	// committed first is not counted.
	res, err := t.tx.ExecContext(ctx, `
		INSERT INTO idempotency_keys (idempotency_key, sku, request_hash, order_id)
		VALUES `+placeholders(len(records), "(?, ?, ?, ?)")+`
		ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key`, args...)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	n, err := res.RowsAffected()
	return int(n), wrap(ctx, err)
}

// utcOrNull is t as a UTC DATETIME for a bound, nil (NULL) for none.
func utcOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

// placeholders repeats one row's placeholders n times, comma-separated.
func placeholders(n int, row string) string {
	return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
}

// openNow is the condition of a sale whose window is open on the
// database's clock, for the writes that check and deduct in one statement.
const openNow = `(starts_at IS NULL OR starts_at <= UTC_TIMESTAMP(6)) AND (ends_at IS NULL OR ends_at > UTC_TIMESTAMP(6))`

// levelQuery reads a stock row as inventory.Level: the window's state
// judged by the database's clock.
const levelQuery = `SELECT available, version, fence,
	CASE WHEN starts_at > UTC_TIMESTAMP(6) THEN 1 WHEN ends_at <= UTC_TIMESTAMP(6) THEN 2 ELSE 0 END
	FROM stock WHERE sku = ?`

func readLevel(ctx context.Context, q querier, sku, query string) (inventory.Level, error) {
	var l inventory.Level
	err := q.QueryRowContext(ctx, query, sku).Scan(&l.Available, &l.Version, &l.Fence, &l.Window)
	if errors.Is(err, sql.ErrNoRows) {
		return l, fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return l, wrap(ctx, err)
}

func getOrder(ctx context.Context, q querier, id string) (inventory.Order, error) {
	o := inventory.Order{ID: id}
	var expires sql.NullTime
	err := q.QueryRowContext(ctx, `
		SELECT sku, quantity, user_id, strategy, state, expires_at,
		       state = 'held' AND expires_at <= UTC_TIMESTAMP(6), claimed
		FROM orders WHERE id = ?`, id).Scan(&o.SKU, &o.Quantity, &o.UserID, &o.Strategy, &o.State, &expires, &o.Lapsed, &o.Claimed)
	if expires.Valid {
		// DATETIME in UTC (UTC_TIMESTAMP), read back as UTC: the
		// driver's default loc.
		o.ExpiresAt = expires.Time.UTC()
	}
	return o, err
}

// execAffected runs a write and reports whether it touched a row.
func (t *tx) execAffected(ctx context.Context, query string, args ...any) (bool, error) {
	res, err := t.tx.ExecContext(ctx, query, args...)
	if err != nil {
		return false, wrap(ctx, err)
	}
	n, err := res.RowsAffected()
	return n > 0, wrap(ctx, err)
}

// MySQL error numbers the service acts on.
const (
	erLockWaitTimeout   = 1205
	erLockDeadlock      = 1213
	erDuplicateKey      = 1062
	erCheckRead         = 1020 // MariaDB innodb_snapshot_isolation: the row changed since the snapshot
	erTooManyConns      = 1040
	erServerShutdown    = 1053
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
		case erTooManyConns, erServerShutdown:
			return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
		}
		return fmt.Errorf("mysql: %w", err)
	}
	// Anything else on the way to the server (refused, reset, bad
	// connection) means the database is out of reach.
	return fmt.Errorf("%w: %w", inventory.ErrUnavailable, err)
}

// wrapCommit files a commit error. The server's own refusal means the
// transaction was rolled back, and so does driver.ErrBadConn (the driver
// returns it only when nothing was sent). So do sql.ErrTxDone and the
// context's own error: database/sql returns them without sending COMMIT when
// the transaction's context ended, and rolls the transaction back itself.
// Any other failure leaves the outcome unknown.
func wrapCommit(ctx context.Context, err error) error {
	var myErr *mysql.MySQLError
	if errors.As(err, &myErr) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrTxDone) ||
		ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return wrap(ctx, err)
	}
	return fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
}
