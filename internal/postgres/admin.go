package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
)

// The admin writes' keys and records (sql/postgres/00007), the lookups
// that resolve a lost commit answer, and a buyer's list of orders.

// retentionSeconds is inventory.AdminKeyRetention in whole seconds, as
// the statements take it.
var retentionSeconds = int64(inventory.AdminKeyRetention / time.Second)

// FindAdminKey implements inventory.Store. A record older than the
// retention is as good as pruned.
func (s *Store) FindAdminKey(ctx context.Context, key string) (inventory.AdminRecord, bool, error) {
	r := inventory.AdminRecord{Key: key}
	var restock *string
	err := s.pool.QueryRow(ctx, `
		SELECT action, sku, request_hash, sale_epoch, restock_id::text FROM admin_idempotency_keys
		WHERE idempotency_key = $1 AND created_at > now() - $2::bigint * interval '1 second'`, key, retentionSeconds).
		Scan(&r.Action, &r.SKU, &r.RequestHash, &r.Sale, &restock)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if restock != nil {
		r.RestockID = *restock
	}
	return r, err == nil, wrap(ctx, err)
}

// InsertAdminKey implements inventory.Tx. ON CONFLICT DO NOTHING waits for
// a concurrent insert of the same key and then reports no row. The same
// key's own record, when past the retention, is deleted first, with a
// few of the oldest others: the table holds about a day of admin writes.
func (t *tx) InsertAdminKey(ctx context.Context, r inventory.AdminRecord) (bool, error) {
	if _, err := t.tx.Exec(ctx, `
		DELETE FROM admin_idempotency_keys WHERE idempotency_key IN (
			SELECT idempotency_key FROM admin_idempotency_keys
			WHERE created_at <= now() - $1::bigint * interval '1 second'
			ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED)
		   OR idempotency_key = $2 AND created_at <= now() - $1::bigint * interval '1 second'`, retentionSeconds, r.Key); err != nil {
		return false, wrap(ctx, err)
	}
	var restock *string
	if r.RestockID != "" {
		restock = &r.RestockID
	}
	return t.execAffected(ctx, `
		INSERT INTO admin_idempotency_keys (idempotency_key, action, sku, request_hash, sale_epoch, restock_id)
		VALUES ($1, $2, $3, $4, $5, $6::text::uuid)
		ON CONFLICT (idempotency_key) DO NOTHING`, r.Key, r.Action, r.SKU, r.RequestHash, r.Sale, restock)
}

// FindRestockByKey implements inventory.Store.
func (s *Store) FindRestockByKey(ctx context.Context, sku, key string) (inventory.Restock, bool, error) {
	r := inventory.Restock{SKU: sku, Key: key}
	err := s.pool.QueryRow(ctx, `
		SELECT id::text, quantity, created_at FROM restocks WHERE sku = $1 AND idempotency_key = $2
		ORDER BY created_at LIMIT 1`, sku, key).Scan(&r.ID, &r.Quantity, &r.At)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	r.At = r.At.UTC()
	return r, err == nil, wrap(ctx, err)
}

// RecordRestock implements inventory.Tx.
func (t *tx) RecordRestock(ctx context.Context, r inventory.Restock, relay bool) error {
	var key *string
	if r.Key != "" {
		key = &r.Key
	}
	_, err := t.tx.Exec(ctx, `
		INSERT INTO restocks (id, sku, quantity, relay_pending, idempotency_key) VALUES ($1, $2, $3, $4, $5)`,
		r.ID, r.SKU, r.Quantity, relay, key)
	return wrap(ctx, err)
}

// Restock implements inventory.Tx.
func (t *tx) Restock(ctx context.Context, sku string, quantity int64) (available, sale int64, ok bool, err error) {
	// Like a return, a restock only adds: the version is left alone.
	err = t.tx.QueryRow(ctx, `
		UPDATE stock SET available = available + $2, restocked = restocked + $2 WHERE sku = $1
		RETURNING available, sale_epoch`, sku, quantity).Scan(&available, &sale)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, false, nil
	}
	return available, sale, err == nil, wrap(ctx, err)
}

// listRestocks lists the newest restocks of the SKU's sale, oldest first.
func listRestocks(ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, sku string) ([]inventory.Restock, error) {
	rows, err := q.Query(ctx, `
		SELECT id::text, sku, quantity, COALESCE(idempotency_key, ''), created_at FROM (
			SELECT * FROM restocks WHERE sku = $1 ORDER BY created_at DESC, id DESC LIMIT $2) r
		ORDER BY created_at, id`, sku, inventory.MaxAuditRestocks)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (inventory.Restock, error) {
		var x inventory.Restock
		err := r.Scan(&x.ID, &x.SKU, &x.Quantity, &x.Key, &x.At)
		x.At = x.At.UTC()
		return x, err
	})
}

// awaitStockRow is the share lock on the SKU's stock row that
// ResolveOrder and ResolveRestock wait for: every transaction that wrote
// the row (each order, restock and start does) has ended when it is
// granted, and the next statement, under READ COMMITTED, reads what they
// committed. The wait is bounded by the transaction's lock_timeout (the
// caller's deadline, beginQuery).
const awaitStockRow = `SELECT 1 FROM stock WHERE sku = $1 FOR SHARE`

// ResolveOrder implements inventory.Tx (and batched.Tx).
func (t *tx) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	if _, err := t.tx.Exec(ctx, awaitStockRow, sku); err != nil {
		return inventory.Order{}, false, wrap(ctx, err)
	}
	o, err := getOrder(ctx, t.tx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return inventory.Order{}, false, nil
	}
	return o, err == nil, wrap(ctx, err)
}

// ResolveRestock implements inventory.Store.
func (s *Store) ResolveRestock(ctx context.Context, sku, id string) (bool, error) {
	found := false
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		if _, err := t.tx.Exec(ctx, awaitStockRow, sku); err != nil {
			return wrap(ctx, err)
		}
		return wrap(ctx, t.tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM restocks WHERE id = $1::text::uuid)`, id).Scan(&found))
	})
	return found, err
}

// ListOrders implements inventory.Store, on the index (user_id, sku).
func (s *Store) ListOrders(ctx context.Context, userID, sku, after string, limit int) ([]inventory.Order, error) {
	if after == "" {
		after = "00000000-0000-0000-0000-000000000000"
	}
	rows, err := s.pool.Query(ctx, `
		SELECT id::text, sku, quantity, user_id, strategy, state, expires_at,
		       state = 'held' AND expires_at <= statement_timestamp(), claimed
		FROM orders WHERE user_id = $1 AND ($2 = '' OR sku = $2) AND id > $3::text::uuid
		ORDER BY id LIMIT $4`, userID, sku, after, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	orders, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inventory.Order, error) {
		var o inventory.Order
		var expires *time.Time
		err := r.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Strategy, &o.State, &expires, &o.Lapsed, &o.Claimed)
		if expires != nil {
			o.ExpiresAt = expires.UTC()
		}
		return o, err
	})
	return orders, wrap(ctx, err)
}
