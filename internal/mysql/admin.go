package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/flashsale/stock/internal/inventory"
)

// The admin writes' keys and records (sql/mysql/00007), the lookups that
// resolve a lost commit answer, and a buyer's list of orders.

// retentionMicros is inventory.AdminKeyRetention in microseconds, as the
// statements take it.
var retentionMicros = inventory.AdminKeyRetention.Microseconds()

// FindAdminKey implements inventory.Store. A record older than the
// retention is as good as pruned.
func (s *Store) FindAdminKey(ctx context.Context, key string) (inventory.AdminRecord, bool, error) {
	r := inventory.AdminRecord{Key: key}
	var restock sql.NullString
	err := s.db.QueryRowContext(ctx, `
		SELECT action, sku, request_hash, sale_epoch, restock_id FROM admin_idempotency_keys
		WHERE idempotency_key = ? AND created_at > UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`, key, retentionMicros).
		Scan(&r.Action, &r.SKU, &r.RequestHash, &r.Sale, &restock)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	r.RestockID = restock.String
	return r, err == nil, wrap(ctx, err)
}

// InsertAdminKey implements inventory.Tx. The no-op update waits for a
// concurrent insert of the same key and changes no row (0 affected), as
// InsertIdempotency's does. The same key's own record, when past the
// retention, is deleted first, with a few of the oldest others: the table
// holds about a day of admin writes.
func (t *tx) InsertAdminKey(ctx context.Context, r inventory.AdminRecord) (bool, error) {
	if _, err := t.tx.ExecContext(ctx, `
		DELETE FROM admin_idempotency_keys WHERE idempotency_key = ? AND created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND`,
		r.Key, retentionMicros); err != nil {
		return false, wrap(ctx, err)
	}
	if _, err := t.tx.ExecContext(ctx, `
		DELETE FROM admin_idempotency_keys WHERE created_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
		ORDER BY created_at LIMIT 100`, retentionMicros); err != nil {
		return false, wrap(ctx, err)
	}
	var restock any
	if r.RestockID != "" {
		restock = r.RestockID
	}
	res, err := t.tx.ExecContext(ctx, `
		INSERT INTO admin_idempotency_keys (idempotency_key, action, sku, request_hash, sale_epoch, restock_id)
		VALUES (?, ?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE idempotency_key = idempotency_key`, r.Key, r.Action, r.SKU, r.RequestHash, r.Sale, restock)
	if err != nil {
		return false, wrap(ctx, err)
	}
	n, err := res.RowsAffected()
	return n == 1, wrap(ctx, err)
}

// FindRestockByKey implements inventory.Store.
func (s *Store) FindRestockByKey(ctx context.Context, sku, key string) (inventory.Restock, bool, error) {
	r := inventory.Restock{SKU: sku, Key: key}
	err := s.db.QueryRowContext(ctx, `
		SELECT id, quantity, created_at FROM restocks WHERE sku = ? AND idempotency_key = ?
		ORDER BY created_at LIMIT 1`, sku, key).Scan(&r.ID, &r.Quantity, &r.At)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	r.At = r.At.UTC()
	return r, err == nil, wrap(ctx, err)
}

// RecordRestock implements inventory.Tx.
func (t *tx) RecordRestock(ctx context.Context, r inventory.Restock, relay bool) error {
	var key any
	if r.Key != "" {
		key = r.Key
	}
	_, err := t.tx.ExecContext(ctx, `
		INSERT INTO restocks (id, sku, quantity, relay_pending, idempotency_key) VALUES (?, ?, ?, ?, ?)`,
		r.ID, r.SKU, r.Quantity, relay, key)
	return wrap(ctx, err)
}

// Restock implements inventory.Tx. The row stays locked by the UPDATE
// until the commit, so the read after it is this transaction's.
func (t *tx) Restock(ctx context.Context, sku string, quantity int64) (available, sale int64, ok bool, err error) {
	// Like a return, a restock only adds: the version is left alone.
	ok, err = t.execAffected(ctx, `
		UPDATE stock SET available = available + ?, restocked = restocked + ? WHERE sku = ?`, quantity, quantity, sku)
	if err != nil || !ok {
		return 0, 0, false, err
	}
	err = t.tx.QueryRowContext(ctx, `SELECT available, sale_epoch FROM stock WHERE sku = ? FOR UPDATE`, sku).Scan(&available, &sale)
	return available, sale, err == nil, wrap(ctx, err)
}

// listRestocks lists the newest restocks of the SKU's sale, oldest first.
func listRestocks(ctx context.Context, tx *sql.Tx, sku string) ([]inventory.Restock, error) {
	rows, err := tx.QueryContext(ctx, `
		SELECT id, sku, quantity, COALESCE(idempotency_key, ''), created_at FROM (
			SELECT * FROM restocks WHERE sku = ? ORDER BY created_at DESC, id DESC LIMIT ?) r
		ORDER BY created_at, id`, sku, inventory.MaxAuditRestocks)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []inventory.Restock
	for rows.Next() {
		var r inventory.Restock
		if err := rows.Scan(&r.ID, &r.SKU, &r.Quantity, &r.Key, &r.At); err != nil {
			return nil, err
		}
		r.At = r.At.UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// awaitStockRow is the share lock on the SKU's stock row that
// ResolveOrder and ResolveRestock wait for: every transaction that wrote
// the row (each order, restock and start does) has ended when it is
// granted. A locking read sets no snapshot: the plain read after it sets
// the transaction's, and sees what those transactions committed. The wait
// is bounded by the transaction's lock wait (the caller's deadline).
const awaitStockRow = `SELECT 1 FROM stock WHERE sku = ? LOCK IN SHARE MODE`

// ResolveOrder implements inventory.Tx (and batched.Tx). It must be the
// transaction's first read: a plain read before the lock would set the
// snapshot the order is read from.
func (t *tx) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	var one int
	if err := t.tx.QueryRowContext(ctx, awaitStockRow, sku).Scan(&one); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return inventory.Order{}, false, wrap(ctx, err)
	}
	o, err := getOrder(ctx, t.tx, id)
	if errors.Is(err, sql.ErrNoRows) {
		return inventory.Order{}, false, nil
	}
	return o, err == nil, wrap(ctx, err)
}

// ResolveRestock implements inventory.Store.
func (s *Store) ResolveRestock(ctx context.Context, sku, id string) (bool, error) {
	found := false
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		var one int
		if err := t.tx.QueryRowContext(ctx, awaitStockRow, sku).Scan(&one); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return wrap(ctx, err)
		}
		return wrap(ctx, t.tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM restocks WHERE id = ?)`, id).Scan(&found))
	})
	return found, err
}

// ListOrders implements inventory.Store, on the index (user_id, sku).
func (s *Store) ListOrders(ctx context.Context, userID, sku, after string, limit int) ([]inventory.Order, error) {
	rows, err := s.db.QueryContext(ctx, `
		SELECT id, sku, quantity, user_id, strategy, state, expires_at,
		       state = 'held' AND expires_at <= UTC_TIMESTAMP(6), claimed
		FROM orders WHERE user_id = ? AND (? = '' OR sku = ?) AND id > ?
		ORDER BY id LIMIT ?`, userID, sku, sku, after, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	var orders []inventory.Order
	for rows.Next() {
		var o inventory.Order
		var expires sql.NullTime
		if err := rows.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Strategy, &o.State, &expires, &o.Lapsed, &o.Claimed); err != nil {
			return nil, wrap(ctx, err)
		}
		if expires.Valid {
			o.ExpiresAt = expires.Time.UTC()
		}
		orders = append(orders, o)
	}
	return orders, wrap(ctx, rows.Err())
}
