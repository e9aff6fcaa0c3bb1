package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// The relay of returns to a store that counts stock outside the database
// (the reservation strategies' Redis): a cancel or an expiry marks its
// order (relay_pending) in the transaction that returns its units here,
// and the relay hands the marked orders to that store and clears the
// marks (sql/postgres/00006_return_relay.sql).

// MarkRelay implements inventory.Tx.
func (t *tx) MarkRelay(ctx context.Context, ids []string) error {
	_, err := t.tx.Exec(ctx, `UPDATE orders SET relay_pending = true WHERE id = ANY($1::text[]::uuid[])`, ids)
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
// paired the old number with the new sale's orders, and their returns were
// dropped as another sale's (found by review). One statement for every SKU
// of skus: the sweep relays a batch of holds lapsed over a whole catalog
// in a few round trips, not a few per SKU (BenchmarkSweep).
func (s *Store) RelayMarked(ctx context.Context, skus []string, kind reservation.RelayKind, limit int, apply func(ctx context.Context, marked []reservation.Marked) ([]string, error)) (int, error) {
	table, user := "orders", "o.user_id, o.claimed"
	if kind == reservation.Restocks {
		table, user = "restocks", "'', 0"
	}
	rows, err := s.pool.Query(ctx, `
		SELECT s.sku, s.sale_epoch, o.id, `+user+`, o.quantity
		FROM stock s JOIN `+table+` o ON o.sku = s.sku
		WHERE s.sku = ANY($1::text[]) AND o.relay_pending
		ORDER BY o.sku COLLATE "C", o.id LIMIT $2`, skus, limit)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	var marked []reservation.Marked
	var sale int64
	var o inventory.Order
	if _, err := pgx.ForEachRow(rows, []any{&o.SKU, &sale, &o.ID, &o.UserID, &o.Claimed, &o.Quantity}, func() error {
		marked = reservation.AddMarked(marked, sale, o)
		return nil
	}); err != nil || len(marked) == 0 {
		return 0, wrap(ctx, err)
	}
	taken, err := apply(ctx, marked)
	relayed, handed := reservation.TakenItems(marked, taken)
	if len(relayed) > 0 {
		ids := make([]string, len(relayed))
		for i, o := range relayed {
			ids[i] = o.ID
		}
		// Rows another transaction holds keep their marks: the next relay
		// hands them over again (and the store takes them once), rather
		// than this one waiting for it.
		if _, cerr := s.pool.Exec(ctx, `
			UPDATE `+table+` SET relay_pending = false
			WHERE id IN (SELECT id FROM `+table+` WHERE id = ANY($1::text[]::uuid[]) AND relay_pending FOR UPDATE SKIP LOCKED)`, ids); cerr != nil {
			return 0, errors.Join(err, wrap(ctx, cerr))
		}
	}
	return handed, err
}

// SKUsRelaying lists at most limit SKUs with marked orders or restocks
// (the partial index holds the marked orders only).
func (s *Store) SKUsRelaying(ctx context.Context, limit int) ([]string, error) {
	rows, err := s.pool.Query(ctx, `
		(SELECT DISTINCT sku FROM orders WHERE relay_pending LIMIT $1)
		UNION
		(SELECT DISTINCT sku FROM restocks WHERE relay_pending LIMIT $1)
		LIMIT $1`, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	skus, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return skus, wrap(ctx, err)
}

// Restocks implements reservation.SaleRecheck: every restock of the sale.
func (r pgRecheck) Restocks(ctx context.Context) ([]inventory.Order, error) {
	return r.orders(ctx, `SELECT id, '', 0, quantity FROM restocks WHERE sku = $1`)
}

// ReturnedOrders implements reservation.SaleRecheck: every order of the sale
// that gave its units back.
func (r pgRecheck) ReturnedOrders(ctx context.Context) ([]inventory.Order, error) {
	return r.orders(ctx, `SELECT id, user_id, claimed, quantity FROM orders WHERE sku = $1 AND state IN ('cancelled', 'expired')`)
}

// orders runs query (of id, user id, quantity, for the SKU) in the check's
// transaction.
func (r pgRecheck) orders(ctx context.Context, query string) ([]inventory.Order, error) {
	rows, err := r.t.tx.Query(ctx, query, r.sku)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (inventory.Order, error) {
		o := inventory.Order{SKU: r.sku}
		return o, row.Scan(&o.ID, &o.UserID, &o.Claimed, &o.Quantity)
	})
	return found, wrap(ctx, err)
}
