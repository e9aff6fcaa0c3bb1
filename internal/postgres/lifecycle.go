package postgres

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
)

// The order lifecycle's statements (inventory.Tx): each transition is one
// conditional UPDATE on the order row, judged by the database's clock at
// the statement: statement_timestamp(), not now(), which is the time the
// transaction began (a transaction begun before a hold lapsed could pay it
// after). MariaDB's UTC_TIMESTAMP(6) is the statement's time too.

func (t *tx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	// Pay and cancel only while the hold runs, expiry only once it has
	// lapsed: the two sides of expires_at on one clock, so exactly one of a
	// racing pay and expiry matches. The row lock makes the second UPDATE
	// re-check state = 'held' against the first one's commit.
	lapsed := `expires_at > statement_timestamp()`
	if to == inventory.OrderExpired {
		lapsed = `expires_at <= statement_timestamp()`
	}
	return t.execAffected(ctx, `
		UPDATE orders SET state = $3, settled_at = statement_timestamp()
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
		UPDATE orders SET state = 'expired', settled_at = statement_timestamp()
		WHERE state = 'held' AND id IN (
			SELECT id FROM orders WHERE state = 'held' AND expires_at <= statement_timestamp()
			ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)
		RETURNING id::text, sku, quantity, user_id, claimed`, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	expired, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (inventory.Order, error) {
		o := inventory.Order{State: inventory.OrderExpired}
		return o, r.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Claimed)
	})
	return expired, wrap(ctx, err)
}

func (t *tx) ClaimUnits(ctx context.Context, sku, userID string, quantity, limit int64) (bool, error) {
	// The buyer's row is created with the first order or grows while it
	// stays within the limit; an order of the same buyer on another
	// instance waits for this transaction's row lock and then sees its
	// units (ON CONFLICT re-checks the WHERE on the committed row).
	return t.execAffected(ctx, `
		INSERT INTO buyer_units (sku, user_id, units) SELECT $1::text, $2::text, $3::bigint WHERE $3::bigint <= $4::bigint
		ON CONFLICT (sku, user_id) DO UPDATE SET units = buyer_units.units + excluded.units
		WHERE buyer_units.units + excluded.units <= $4::bigint`, sku, userID, quantity, limit)
}

func (t *tx) ReleaseUnits(ctx context.Context, sku, userID string, quantity int64) error {
	// quantity is what the order claimed, so the count stays at what the
	// buyer's other counted orders hold and the floor never binds. It is
	// kept for rows a version before orders.claimed wrote during a
	// rolling deploy: a count a step too low there must never make a
	// cancel, or the sweep whose batch holds it, fail.
	_, err := t.tx.Exec(ctx, `
		UPDATE buyer_units SET units = GREATEST(units - $3, 0) WHERE sku = $1 AND user_id = $2`, sku, userID, quantity)
	return wrap(ctx, err)
}

func (t *tx) LockBuyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	rows, err := t.tx.Query(ctx, `
		SELECT user_id, units FROM buyer_units WHERE sku = $1 AND user_id = ANY($2)
		ORDER BY user_id COLLATE "C" FOR UPDATE`, sku, userIDs)
	return scanBuyerUnits(ctx, rows, err)
}

// BuyerUnits implements inventory.Store: one read of the primary key,
// outside any transaction, locking nothing.
func (s *Store) BuyerUnits(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT user_id, units FROM buyer_units WHERE sku = $1 AND user_id = ANY($2)`, sku, userIDs)
	return scanBuyerUnits(ctx, rows, err)
}

// scanBuyerUnits reads the (user_id, units) rows of a query of
// buyer_units.
func scanBuyerUnits(ctx context.Context, rows pgx.Rows, err error) (map[string]int64, error) {
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	units := map[string]int64{}
	for rows.Next() {
		var u string
		var n int64
		if err := rows.Scan(&u, &n); err != nil {
			return nil, wrap(ctx, err)
		}
		units[u] = n
	}
	return units, wrap(ctx, rows.Err())
}

func (t *tx) ClaimFirstUnits(ctx context.Context, sku string, claims map[string]int64) ([]string, error) {
	// DO NOTHING waits for a transaction inserting the same buyer, and
	// leaves the buyer out if it commits; a row that exists is not locked.
	users, quantities := sortedClaims(claims)
	rows, err := t.tx.Query(ctx, `
		INSERT INTO buyer_units (sku, user_id, units)
		SELECT $1::text, u, q FROM unnest($2::text[], $3::bigint[]) AS c (u, q)
		ON CONFLICT (sku, user_id) DO NOTHING
		RETURNING user_id`, sku, users, quantities)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	created, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return created, wrap(ctx, err)
}

func (t *tx) ClaimUnitsOf(ctx context.Context, sku string, claims, _ map[string]int64, limit int64) (bool, error) {
	users, quantities := sortedClaims(claims)
	tag, err := t.tx.Exec(ctx, `
		INSERT INTO buyer_units (sku, user_id, units)
		SELECT $1::text, u, q FROM unnest($2::text[], $3::bigint[]) AS c (u, q) WHERE q <= $4::bigint
		ON CONFLICT (sku, user_id) DO UPDATE SET units = buyer_units.units + excluded.units
		WHERE buyer_units.units + excluded.units <= $4::bigint`, sku, users, quantities, limit)
	if err != nil {
		return false, wrap(ctx, err)
	}
	return tag.RowsAffected() == int64(len(users)), nil
}

func (t *tx) ReleaseUnitsOf(ctx context.Context, sku string, units map[string]int64) error {
	users, quantities := sortedClaims(units)
	// The rows are locked first, in buyer order (byte order, as Go sorts:
	// COLLATE "C"), then updated. An UPDATE … FROM unnest alone locks them
	// in the order its join emits them: for a sweep's batch of hundreds
	// of buyers on a SKU of many rows the planner can hash the list and
	// scan the table, heap order, and two such statements deadlock (found
	// by review; TestReleaseUnitsOfLocksInBuyerOrder).
	_, err := t.tx.Exec(ctx, `
		WITH locked AS MATERIALIZED (
			SELECT user_id FROM buyer_units WHERE sku = $1 AND user_id = ANY($2::text[])
			ORDER BY user_id COLLATE "C" FOR UPDATE)
		UPDATE buyer_units b SET units = GREATEST(b.units - r.q, 0)
		FROM locked l JOIN unnest($2::text[], $3::bigint[]) AS r (u, q) ON r.u = l.user_id
		WHERE b.sku = $1 AND b.user_id = l.user_id`, sku, users, quantities)
	return wrap(ctx, err)
}

func (t *tx) ReturnEach(ctx context.Context, returns []inventory.Order) error {
	if len(returns) == 0 {
		return nil
	}
	skus, quantities := make([]string, len(returns)), make([]int64, len(returns))
	for i, r := range returns {
		skus[i], quantities[i] = r.SKU, r.Quantity
	}
	// The rows are locked first, in SKU order (COLLATE "C": byte order, as
	// Go sorts and as DeductEach takes them), then updated: an UPDATE …
	// FROM unnest alone takes them in the order its join emits them.
	rows, err := t.tx.Query(ctx, `
		WITH locked AS MATERIALIZED (
			SELECT sku FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku COLLATE "C" FOR UPDATE)
		UPDATE stock SET available = available + r.q
		FROM locked l JOIN unnest($1::text[], $2::bigint[]) AS r (sku, q) ON r.sku = l.sku
		WHERE stock.sku = l.sku
		RETURNING stock.sku`, skus, quantities)
	if err != nil {
		return wrap(ctx, err)
	}
	returned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return wrap(ctx, err)
	}
	return missingSKU(skus, returned)
}

// missingSKU is ErrUnknownSKU naming the first of want that got is
// without, nil when got has every one.
func missingSKU(want, got []string) error {
	if len(got) == len(want) {
		return nil
	}
	for _, sku := range want {
		if !slices.Contains(got, sku) {
			return fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
		}
	}
	return nil
}

func (t *tx) ReleaseEach(ctx context.Context, claims []inventory.Order) error {
	if len(claims) == 0 {
		return nil
	}
	skus, users, quantities := make([]string, len(claims)), make([]string, len(claims)), make([]int64, len(claims))
	for i, c := range claims {
		skus[i], users[i], quantities[i] = c.SKU, c.UserID, c.Quantity
	}
	// Locked first in (SKU, buyer) order, as ReleaseUnitsOf locks one
	// SKU's buyers and as every transaction takes buyers: SKU by SKU,
	// each SKU's in buyer order.
	_, err := t.tx.Exec(ctx, `
		WITH wanted AS (
			SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r (sku, u, q)
		), locked AS MATERIALIZED (
			SELECT b.sku, b.user_id FROM buyer_units b JOIN wanted w ON b.sku = w.sku AND b.user_id = w.u
			ORDER BY b.sku COLLATE "C", b.user_id COLLATE "C" FOR UPDATE OF b)
		UPDATE buyer_units b SET units = GREATEST(b.units - w.q, 0)
		FROM locked l JOIN wanted w ON w.sku = l.sku AND w.u = l.user_id
		WHERE b.sku = l.sku AND b.user_id = l.user_id`, skus, users, quantities)
	return wrap(ctx, err)
}

// sortedClaims lists the buyers of claims in order, with their units:
// statements over several buyers' rows take them in buyer order, as every
// transaction does, so two never wait for each other's in opposite orders.
func sortedClaims(claims map[string]int64) ([]string, []int64) {
	users, quantities := make([]string, 0, len(claims)), make([]int64, 0, len(claims))
	for u := range claims {
		users = append(users, u)
	}
	slices.Sort(users)
	for _, u := range users {
		quantities = append(quantities, claims[u])
	}
	return users, quantities
}
