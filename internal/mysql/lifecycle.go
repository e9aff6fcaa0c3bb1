package mysql

import (
	"context"
	"fmt"

	"github.com/flashsale/stock/internal/inventory"
)

// The order lifecycle's statements (inventory.Tx): each transition is one
// conditional UPDATE on the order row, judged by the database's clock
// (UTC_TIMESTAMP(6), the clock expires_at was written with).

// stateOf is the state a new order is written with: final unless it says
// otherwise.
func stateOf(o inventory.Order) string {
	if o.State == "" {
		return inventory.OrderFinal
	}
	return o.State
}

func (t *tx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	// Pay and cancel only while the hold runs, expiry only once it has
	// lapsed: the two sides of expires_at on one clock, so exactly one of a
	// racing pay and expiry matches. InnoDB's UPDATE reads the row's latest
	// version under its lock, so the second of two racing UPDATEs sees the
	// first one's state, whatever the transaction's snapshot.
	lapsed := `expires_at > UTC_TIMESTAMP(6)`
	if to == inventory.OrderExpired {
		lapsed = `expires_at <= UTC_TIMESTAMP(6)`
	}
	return t.execAffected(ctx, `
		UPDATE orders SET state = ?, settled_at = UTC_TIMESTAMP(6)
		WHERE id = ? AND user_id = ? AND state = 'held' AND `+lapsed, to, id, userID)
}

func (t *tx) ReturnUnits(ctx context.Context, sku string, quantity int64) error {
	ok, err := t.execAffected(ctx, `UPDATE stock SET available = available + ? WHERE sku = ?`, quantity, sku)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return err
}

func (t *tx) ExpireLapsed(ctx context.Context, limit int) ([]inventory.Order, error) {
	// MariaDB's UPDATE has no RETURNING: lock the lapsed holds first (SKIP
	// LOCKED: a second sweeper takes other orders, and an order a pay or
	// cancel is moving is left to it), then move exactly those.
	rows, err := t.tx.QueryContext(ctx, `
		SELECT id, sku, quantity FROM orders
		WHERE state = 'held' AND expires_at <= UTC_TIMESTAMP(6)
		ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	var expired []inventory.Order
	for rows.Next() {
		o := inventory.Order{State: inventory.OrderExpired}
		if err := rows.Scan(&o.ID, &o.SKU, &o.Quantity); err != nil {
			_ = rows.Close()
			return nil, wrap(ctx, err)
		}
		expired = append(expired, o)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	if len(expired) == 0 {
		return nil, nil
	}
	args := make([]any, len(expired))
	for i, o := range expired {
		args[i] = o.ID
	}
	res, err := t.tx.ExecContext(ctx, `
		UPDATE orders SET state = 'expired', settled_at = UTC_TIMESTAMP(6)
		WHERE state = 'held' AND id IN (`+placeholders(len(expired), "?")+`)`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	// The rows are locked since the SELECT: every one must still be held.
	if n, err := res.RowsAffected(); err != nil || n != int64(len(expired)) {
		return nil, fmt.Errorf("mysql: expiring %d locked holds changed %d rows: %w", len(expired), n, err)
	}
	return expired, nil
}
