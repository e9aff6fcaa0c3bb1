package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
)

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
const levelQuery = `SELECT available, version, fence, ` + windowCase + `
	FROM stock WHERE sku = $1`

// windowCase is a stock row's window state (inventory.Level's Window) on
// the database's clock.
const windowCase = `CASE WHEN starts_at > statement_timestamp() THEN 1 WHEN ends_at <= statement_timestamp() THEN 2 ELSE 0 END`

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

// AwaitOrderReplicated returns once order id's row is on the synchronous
// standbys, if the server has any: a transaction that locks the row (a
// WAL record of its own) and commits, so that its COMMIT waits for the
// standbys, which receive the WAL in order, the order's commit before it.
// A replay answers from a read, which commits nothing and waits for no
// standby, while an order whose COMMIT's wait was ended (a termination, a
// demotion's shutdown) is visible on the primary before its standby has
// it: answered 201 so, it could be lost with the primary (found by review;
// TestARetryOfAnOrderItsStandbyLacksIsNotAnswered201). The order's row,
// not the stock row: a replay must not queue behind a hot SKU's orders. A
// row not written yet (a reservation strategy's order still in its
// stream) locks nothing and waits for nothing: that 201 rests on Redis.
// A commit whose own wait is cut short is inventory.ErrOutcomeUnknown, as
// inTx makes it.
func (s *Store) AwaitOrderReplicated(ctx context.Context, id string) error {
	return s.awaitLocked(ctx, `SELECT 1 FROM orders WHERE id = $1 FOR SHARE`, id)
}

// AwaitSaleReplicated is AwaitOrderReplicated for a SKU's sale (its stock
// row): what an admin's replay answers from (a start, a restock).
func (s *Store) AwaitSaleReplicated(ctx context.Context, sku string) error {
	return s.awaitLocked(ctx, awaitStockRow, sku)
}

func (s *Store) awaitLocked(ctx context.Context, lockQuery, arg string) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error {
		_, err := t.tx.Exec(ctx, lockQuery, arg)
		return wrap(ctx, err)
	})
}
