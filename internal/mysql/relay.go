package mysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// The relay of returns to a store that counts stock outside the database
// (the reservation strategies' Redis): a cancel or an expiry marks its
// order (relay_pending) in the transaction that returns its units here,
// and the relay hands the marked orders to that store and clears the
// marks (sql/mysql/00006_return_relay.sql).

// MarkRelay implements inventory.Tx.
func (t *tx) MarkRelay(ctx context.Context, ids []string) error {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	_, err := t.tx.ExecContext(ctx, `
		UPDATE orders FORCE INDEX (PRIMARY) SET relay_pending = TRUE
		WHERE id IN (`+placeholders(len(ids), "?")+`)`, args...)
	return wrap(ctx, err)
}

// RelayMarked implements reservation.EpochSales: the marked orders (or
// restocks) of skus, by SKU, each SKU's with its sale's number, to apply;
// the marks of the SKUs apply took are cleared. No transaction stays open
// while apply runs: a store that hangs must not hold a connection and row
// locks (found by review: pays queued behind relays waiting for a hung
// Redis). So two relays may hand over the same orders, and a relay whose
// clearing is lost hands them over again: apply must take each order once
// however often it is given it. The orders and the numbers are read in one
// statement, one snapshot: read apart, a new sale between the two reads
// paired the old number with the new sale's orders (found by review on
// PostgreSQL). No locking read: over the index (relay_pending, sku) it
// would lock gaps where other orders' entries go. One statement for every
// SKU of skus: the sweep relays a batch of holds lapsed over a whole
// catalog in a few round trips, not a few per SKU (BenchmarkSweep).
func (s *Store) RelayMarked(ctx context.Context, skus []string, kind reservation.RelayKind, limit int, apply func(ctx context.Context, marked []reservation.Marked) ([]string, error)) (int, error) {
	table, user := "orders", "o.user_id, o.claimed"
	if kind == reservation.Restocks {
		table, user = "restocks", "'', 0"
	}
	args := make([]any, 0, len(skus)+1)
	for _, sku := range skus {
		args = append(args, sku)
	}
	rows, err := s.db.QueryContext(ctx, `
		SELECT s.sku, s.sale_epoch, o.id, `+user+`, o.quantity
		FROM stock s JOIN `+table+` o ON o.sku = s.sku
		WHERE s.sku IN (`+placeholders(len(skus), "?")+`) AND o.relay_pending = TRUE
		ORDER BY o.sku, o.id LIMIT ?`, append(args, limit)...)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	var marked []reservation.Marked
	for rows.Next() {
		var o inventory.Order
		var sale int64
		if err := rows.Scan(&o.SKU, &sale, &o.ID, &o.UserID, &o.Claimed, &o.Quantity); err != nil {
			_ = rows.Close()
			return 0, wrap(ctx, err)
		}
		marked = reservation.AddMarked(marked, sale, o)
	}
	if err := rows.Err(); err != nil || len(marked) == 0 {
		return 0, wrap(ctx, err)
	}
	taken, err := apply(ctx, marked)
	relayed, handed := reservation.TakenItems(marked, taken)
	if len(relayed) > 0 {
		if cerr := s.clearMarks(ctx, table, relayed); cerr != nil {
			return 0, errors.Join(err, cerr)
		}
	}
	return handed, err
}

// clearMarks clears the relay marks of the rows of table (orders or
// restocks) with the ids of relayed. Rows another transaction holds keep
// their marks: the next relay hands them over again (and the store takes
// them once), rather than this one waiting for it. On InnoDB a conditional
// UPDATE that matched nothing still holds its row until it ends (found by
// the schedule explorer: a relay's clearing queued behind a pay that had
// found its hold expired).
func (s *Store) clearMarks(ctx context.Context, table string, relayed []inventory.Order) error {
	args := make([]any, len(relayed))
	for i, o := range relayed {
		args[i] = o.ID
	}
	return wrap(ctx, s.inSQLTx(ctx, nil, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `
			SELECT id FROM `+table+` FORCE INDEX (PRIMARY)
			WHERE id IN (`+placeholders(len(args), "?")+`) AND relay_pending = TRUE
			FOR UPDATE SKIP LOCKED`, args...)
		if err != nil {
			return err
		}
		var free []any
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				_ = rows.Close()
				return err
			}
			free = append(free, id)
		}
		if err := rows.Err(); err != nil || len(free) == 0 {
			return err
		}
		_, err = tx.ExecContext(ctx, `
			UPDATE `+table+` FORCE INDEX (PRIMARY) SET relay_pending = FALSE
			WHERE id IN (`+placeholders(len(free), "?")+`)`, free...)
		return err
	}))
}

// SKUsRelaying lists at most limit SKUs with marked orders or restocks (the
// index (relay_pending, sku) reads the marked orders only).
func (s *Store) SKUsRelaying(ctx context.Context, limit int) ([]string, error) {
	return s.queryStrings(ctx, `
		(SELECT DISTINCT sku FROM orders WHERE relay_pending = TRUE LIMIT ?)
		UNION
		(SELECT DISTINCT sku FROM restocks WHERE relay_pending = TRUE LIMIT ?)
		LIMIT ?`, limit, limit, limit)
}

// Restocks implements reservation.SaleRecheck: every restock of the sale.
func (r myRecheck) Restocks(ctx context.Context) ([]inventory.Order, error) {
	return r.orders(ctx, `SELECT id, '', 0, quantity FROM restocks WHERE sku = ?`)
}

// ReturnedOrders implements reservation.SaleRecheck: every order of the sale
// that gave its units back.
func (r myRecheck) ReturnedOrders(ctx context.Context) ([]inventory.Order, error) {
	return r.orders(ctx, `SELECT id, user_id, claimed, quantity FROM orders WHERE sku = ? AND state IN ('cancelled', 'expired')`)
}

// orders runs query (of id, user id, quantity, for the SKU) in the check's
// transaction.
func (r myRecheck) orders(ctx context.Context, query string) ([]inventory.Order, error) {
	rows, err := r.t.tx.QueryContext(ctx, query, r.sku)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	var found []inventory.Order
	for rows.Next() {
		o := inventory.Order{SKU: r.sku}
		if err := rows.Scan(&o.ID, &o.UserID, &o.Claimed, &o.Quantity); err != nil {
			return nil, wrap(ctx, err)
		}
		found = append(found, o)
	}
	return found, wrap(ctx, rows.Err())
}
