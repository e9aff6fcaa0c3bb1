package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

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
	written := 0
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		var current int64
		err := t.tx.QueryRow(ctx, `SELECT sale_epoch FROM stock WHERE sku = $1 FOR UPDATE`, sku).Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q has no sale in the database", inventory.ErrStaleSale, sku)
		}
		if err != nil {
			return wrap(ctx, err)
		}
		if current != epoch {
			return fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d", inventory.ErrStaleSale, sku, current, epoch)
		}
		ids, skus, users, strategies := make([]string, len(orders)), make([]string, len(orders)), make([]string, len(orders)), make([]string, len(orders))
		quantities := make([]int64, len(orders))
		for i, o := range orders {
			ids[i], skus[i], quantities[i], users[i], strategies[i] = o.ID, o.SKU, o.Quantity, o.UserID, o.Strategy
		}
		// The row lock above serialises the writers of this SKU's
		// orders, so ON CONFLICT only ever meets orders committed before.
		var total int64
		if err := t.tx.QueryRow(ctx, `
			WITH written AS (
				INSERT INTO orders (id, sku, quantity, user_id, strategy)
				SELECT * FROM unnest($1::uuid[], $2::text[], $3::integer[], $4::text[], $5::text[])
				ON CONFLICT (id) DO NOTHING
				RETURNING quantity
			)
			SELECT COUNT(*), COALESCE(SUM(quantity), 0) FROM written`,
			ids, skus, quantities, users, strategies).Scan(&written, &total); err != nil {
			return wrap(ctx, err)
		}
		if total > 0 {
			if _, err := t.tx.Exec(ctx, `
				UPDATE stock SET available = available - $2, version = version + 1
				WHERE sku = $1`, sku, total); err != nil {
				return wrap(ctx, err)
			}
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
	return written, nil
}
