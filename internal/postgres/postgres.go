// Package postgres stores inventory in PostgreSQL through pgx/v5. Its SQL is
// written for PostgreSQL alone; internal/mysql has its own.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
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
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: cannot reach %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, wrap(ctx, err))
	}
	return &Store{pool: pool}, nil
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
	pgtx, err := s.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginQuery(ctx)})
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
	return nil
}

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

// timeOrNull is t for a bound, nil (NULL) for none.
func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// querier is what a pool and a transaction have in common.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type tx struct {
	tx pgx.Tx
}

// SessionID returns the server process of the transaction's connection
// (pg_backend_pid), so a test harness can ask the server whether it waits on
// a lock (pg_blocking_pids).
func (t *tx) SessionID(ctx context.Context) (int64, error) {
	var pid int64
	err := t.tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, wrap(ctx, err)
}

func (t *tx) ReadLevel(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, t.tx, sku, levelQuery)
}

func (t *tx) LockLevel(ctx context.Context, sku string) (inventory.Level, error) {
	return readLevel(ctx, t.tx, sku, levelQuery+` FOR UPDATE`)
}

func (t *tx) Deduct(ctx context.Context, sku string, quantity int64) error {
	ok, err := t.execAffected(ctx, `
		UPDATE stock SET available = available - $2, version = version + 1
		WHERE sku = $1`, sku, quantity)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return err
}

func (t *tx) DeductIfVersion(ctx context.Context, sku string, quantity, version int64) (bool, error) {
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - $2, version = version + 1
		WHERE sku = $1 AND version = $3`, sku, quantity, version)
}

func (t *tx) DeductIfAvailable(ctx context.Context, sku string, quantity int64) (bool, error) {
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - $2, version = version + 1
		WHERE sku = $1 AND available >= $2 AND `+openNow, sku, quantity)
}

func (t *tx) DeductIfFenced(ctx context.Context, sku string, quantity, token, readVersion int64) (bool, error) {
	// Under READ COMMITTED an UPDATE that waited for a concurrent writer's
	// row lock checks its WHERE again against the row that writer
	// committed, so a read that went stale meanwhile is refused here.
	return t.execAffected(ctx, `
		UPDATE stock SET available = available - $2, version = version + 1, fence = $3
		WHERE sku = $1 AND fence < $3 AND version = $4`, sku, quantity, token, readVersion)
}

func (t *tx) InsertOrder(ctx context.Context, o inventory.Order) (time.Time, error) {
	// A held order's hold runs from the database's clock, never an
	// instance's clock; its expiry comes back for the order's answer. An
	// expiry given (ExpiresAt, the one its answer promised) is kept when
	// it is the later (GREATEST ignores a NULL).
	const insert = `
		INSERT INTO orders (id, sku, quantity, user_id, strategy, state, expires_at, claimed)
		VALUES ($1, $2, $3, $4, $5, $6, GREATEST($8, CASE WHEN $7::bigint > 0 THEN statement_timestamp() + $7::bigint * interval '1 microsecond' END), $9)`
	args := []any{o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy, stateOf(o), o.Hold.Microseconds(), timeOrNull(o.ExpiresAt), o.Claimed}
	if o.Hold <= 0 && o.ExpiresAt.IsZero() {
		_, err := t.tx.Exec(ctx, insert, args...)
		return time.Time{}, wrap(ctx, err)
	}
	var expires time.Time
	err := t.tx.QueryRow(ctx, insert+` RETURNING expires_at`, args...).Scan(&expires)
	return expires.UTC(), wrap(ctx, err)
}

// stateOf is the state a new order is written with: final unless it says
// otherwise.
func stateOf(o inventory.Order) string {
	if o.State == "" {
		return inventory.OrderFinal
	}
	return o.State
}

func (t *tx) GetOrder(ctx context.Context, id string) (inventory.Order, error) {
	o, err := getOrder(ctx, t.tx, id)
	return o, wrap(ctx, err)
}

func (t *tx) FindIdempotency(ctx context.Context, key string) (inventory.IdempotencyRecord, bool, error) {
	r := inventory.IdempotencyRecord{Key: key}
	err := t.tx.QueryRow(ctx, `
		SELECT sku, request_hash, order_id::text FROM idempotency_keys
		WHERE idempotency_key = $1`, key).Scan(&r.SKU, &r.RequestHash, &r.OrderID)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, wrap(ctx, err)
}

func (t *tx) InsertIdempotency(ctx context.Context, r inventory.IdempotencyRecord) (bool, error) {
	// ON CONFLICT DO NOTHING waits for a concurrent insert of the same key
	// and then reports no row: the key belongs to the other request.
	return t.execAffected(ctx, `
		INSERT INTO idempotency_keys (idempotency_key, sku, request_hash, order_id)
		VALUES ($1, $2, $3, $4)
		ON CONFLICT (idempotency_key) DO NOTHING`, r.Key, r.SKU, r.RequestHash, r.OrderID)
}

func (t *tx) FindIdempotencyKeys(ctx context.Context, keys []string) (map[string]inventory.IdempotencyRecord, error) {
	rows, err := t.tx.Query(ctx, `
		SELECT idempotency_key, sku, request_hash, order_id::text FROM idempotency_keys
		WHERE idempotency_key = ANY($1)`, keys)
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

// InsertOrders inserts the rows of arrays (unnest), so the statement's text
// is the same for any number of orders and its plan is cached. The ids go
// as text[] and are cast in SQL: pgx cannot encode a []string as uuid[] in
// binary, and its failed attempt (an error that prints the whole slice,
// then the text format) cost more than the rest of the statement.
func (t *tx) InsertOrders(ctx context.Context, orders []inventory.Order) ([]time.Time, error) {
	n := len(orders)
	ids, skus, users, strategies, states := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	quantities, holds, claimed := make([]int64, n), make([]int64, n), make([]int64, n)
	expiries := make([]*time.Time, n)
	held := false
	for i, o := range orders {
		ids[i], skus[i], quantities[i], users[i], strategies[i] = o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy
		states[i], holds[i], claimed[i], expiries[i] = stateOf(o), o.Hold.Microseconds(), o.Claimed, timeOrNull(o.ExpiresAt)
		held = held || o.Hold > 0 || !o.ExpiresAt.IsZero()
	}
	const insert = `
		INSERT INTO orders (id, sku, quantity, user_id, strategy, state, expires_at, claimed)
		SELECT id::uuid, sku, quantity, user_id, strategy, state,
		       GREATEST(expires, CASE WHEN hold > 0 THEN statement_timestamp() + hold * interval '1 microsecond' END), claimed
		FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::timestamptz[], $9::bigint[])
		     AS o (id, sku, quantity, user_id, strategy, state, hold, expires, claimed)`
	args := []any{ids, skus, quantities, users, strategies, states, holds, expiries, claimed}
	if !held {
		_, err := t.tx.Exec(ctx, insert, args...)
		return make([]time.Time, n), wrap(ctx, err)
	}
	// The held orders' expiries come back for their answers, by id (the
	// order of RETURNING's rows is not promised).
	rows, err := t.tx.Query(ctx, insert+` RETURNING id::text, expires_at`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	byID := make(map[string]time.Time, n)
	for rows.Next() {
		var id string
		var expires *time.Time
		if err := rows.Scan(&id, &expires); err != nil {
			return nil, wrap(ctx, err)
		}
		if expires != nil {
			byID[id] = expires.UTC()
		}
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	out := make([]time.Time, n)
	for i, id := range ids {
		out[i] = byID[id]
	}
	return out, nil
}

func (t *tx) InsertIdempotencyRecords(ctx context.Context, records []inventory.IdempotencyRecord) (int, error) {
	keys, skus, ids := make([]string, len(records)), make([]string, len(records)), make([]string, len(records))
	hashes := make([][]byte, len(records))
	for i, r := range records {
		keys[i], skus[i], hashes[i], ids[i] = r.Key, r.SKU, r.RequestHash, r.OrderID
	}
	// As InsertIdempotency: ON CONFLICT DO NOTHING waits for concurrent
	// inserts of the same keys, and a key another request committed first
	// is not counted.
	tag, err := t.tx.Exec(ctx, `
		INSERT INTO idempotency_keys (idempotency_key, sku, request_hash, order_id)
		SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[]::uuid[])
		ON CONFLICT (idempotency_key) DO NOTHING`, keys, skus, hashes, ids)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	return int(tag.RowsAffected()), nil
}

// openNow is the condition of a sale whose window is open on the
// database's clock, for the writes that check and deduct in one statement.
const openNow = `(starts_at IS NULL OR starts_at <= statement_timestamp()) AND (ends_at IS NULL OR ends_at > statement_timestamp())`

// levelQuery reads a stock row as inventory.Level: the window's state
// judged by the database's clock.
const levelQuery = `SELECT available, version, fence,
	CASE WHEN starts_at > statement_timestamp() THEN 1 WHEN ends_at <= statement_timestamp() THEN 2 ELSE 0 END
	FROM stock WHERE sku = $1`

func readLevel(ctx context.Context, q querier, sku, query string) (inventory.Level, error) {
	var l inventory.Level
	err := q.QueryRow(ctx, query, sku).Scan(&l.Available, &l.Version, &l.Fence, &l.Window)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return l, wrap(ctx, err)
}

func getOrder(ctx context.Context, q querier, id string) (inventory.Order, error) {
	o := inventory.Order{ID: id}
	var expires *time.Time
	err := q.QueryRow(ctx, `
		SELECT sku, quantity, user_id, strategy, state, expires_at,
		       state = 'held' AND expires_at <= statement_timestamp(), claimed
		FROM orders WHERE id = $1`, id).Scan(&o.SKU, &o.Quantity, &o.UserID, &o.Strategy, &o.State, &expires, &o.Lapsed, &o.Claimed)
	if expires != nil {
		o.ExpiresAt = expires.UTC()
	}
	return o, err
}

// execAffected runs a write and reports whether it touched a row.
func (t *tx) execAffected(ctx context.Context, query string, args ...any) (bool, error) {
	tag, err := t.tx.Exec(ctx, query, args...)
	if err != nil {
		return false, wrap(ctx, err)
	}
	return tag.RowsAffected() > 0, nil
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
// transaction was rolled back; a lost connection leaves the outcome unknown.
func wrapCommit(ctx context.Context, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return wrap(ctx, err)
	}
	if errors.Is(err, pgx.ErrTxCommitRollback) || pgconn.SafeToRetry(err) {
		// Rolled back, or the COMMIT never left this process.
		return wrap(ctx, err)
	}
	return fmt.Errorf("%w: %w", inventory.ErrOutcomeUnknown, err)
}
