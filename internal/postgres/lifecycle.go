package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
)

// The order lifecycle's statements (inventory.Tx): each transition is one
// conditional UPDATE on the order row, judged by the database's now().

func (t *tx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	// Pay and cancel only while the hold runs, expiry only once it has
	// lapsed: the two sides of expires_at on one clock, so exactly one of a
	// racing pay and expiry matches. The row lock makes the second UPDATE
	// re-check state = 'held' against the first one's commit.
	lapsed := `expires_at > now()`
	if to == inventory.OrderExpired {
		lapsed = `expires_at <= now()`
	}
	return t.execAffected(ctx, `
		UPDATE orders SET state = $3, settled_at = now()
		WHERE id = $1 AND user_id = $2 AND state = 'held' AND `+lapsed, id, userID, to)
}

func (t *tx) ReturnUnits(ctx context.Context, sku string, quantity int64) error {
	ok, err := t.execAffected(ctx, `UPDATE stock SET available = available + $2 WHERE sku = $1`, sku, quantity)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return err
}

func (t *tx) ExpireLapsed(ctx context.Context, limit int) ([]inventory.Order, error) {
	// SKIP LOCKED: a second sweeper takes other orders, and an order that a
	// pay or cancel is moving is left to it (its UPDATE decides).
	rows, err := t.tx.Query(ctx, `
		UPDATE orders SET state = 'expired', settled_at = now()
		WHERE state = 'held' AND id IN (
			SELECT id FROM orders WHERE state = 'held' AND expires_at <= now()
			ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id::text, sku, quantity`, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	expired, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inventory.Order, error) {
		o := inventory.Order{State: inventory.OrderExpired}
		return o, r.Scan(&o.ID, &o.SKU, &o.Quantity)
	})
	return expired, wrap(ctx, err)
}
