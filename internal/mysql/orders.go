package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// querier is what a pool and a transaction have in common.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
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
const levelQuery = `SELECT available, version, fence, ` + windowState + ` FROM stock WHERE sku = ?`

// windowState is the window's state of a stock row by the database's
// clock, as inventory.Level.Window has it.
const windowState = `CASE WHEN starts_at > UTC_TIMESTAMP(6) THEN 1 WHEN ends_at <= UTC_TIMESTAMP(6) THEN 2 ELSE 0 END`

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
