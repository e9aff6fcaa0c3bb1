package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/flashsale/stock/internal/inventory"
)

// PersistReserved writes orders that the redis-reserve strategy accepted in
// Redis during sale epoch, in one transaction: the orders that are not in
// the database yet, the deduction of their total, and their idempotency
// records. It returns how many orders it wrote; orders already there (a
// redelivered batch) are skipped, so a replay writes nothing.
//
// The stock row is locked first and its sale_epoch compared: a sale started
// since (StartSale also writes the row) makes the batch stale
// (inventory.ErrStaleSale), and nothing is written. The deduction is
// unconditional: Redis accepted these orders against the same initial
// stock, so the database can only follow it, never refuse it.
func (s *Store) PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	var fresh []inventory.Order
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		fresh = nil
		var current int64
		err := t.tx.QueryRowContext(ctx, `SELECT sale_epoch FROM stock WHERE sku = ? FOR UPDATE`, sku).Scan(&current)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("%w: %q has no sale in the database", inventory.ErrStaleSale, sku)
		}
		if err != nil {
			return wrap(ctx, err)
		}
		if current != epoch {
			return fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d", inventory.ErrStaleSale, sku, current, epoch)
		}
		// The row lock above serialises the writers of this SKU's
		// orders, so the orders found here are all there will be.
		ids := make([]any, len(orders))
		for i, o := range orders {
			ids[i] = o.ID
		}
		rows, err := t.tx.QueryContext(ctx, `SELECT id FROM orders WHERE id IN (`+placeholders(len(ids), "?")+`)`, ids...)
		if err != nil {
			return wrap(ctx, err)
		}
		there := map[string]bool{}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return wrap(ctx, err)
			}
			there[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap(ctx, err)
		}
		var total int64
		for _, o := range orders {
			if !there[o.ID] {
				fresh = append(fresh, o)
				total += o.Quantity
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		if err := t.InsertOrders(ctx, fresh); err != nil {
			return err
		}
		if _, err := t.tx.ExecContext(ctx, `
			UPDATE stock SET available = available - ?, version = version + 1
			WHERE sku = ?`, total, sku); err != nil {
			return wrap(ctx, err)
		}
		if len(keys) > 0 {
			// A key that exists already belongs to an order written
			// before (this batch's earlier delivery): nothing to add.
			if _, err := t.InsertIdempotencyRecords(ctx, keys); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(fresh), nil
}
