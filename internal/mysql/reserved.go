package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// PersistReserved writes orders that the redis-reserve strategy accepted in
// Redis during sale epoch, in one transaction: the orders that are not in
// the database yet, the deduction of their total, and their idempotency
// records. It returns how many orders it wrote; orders already there (a
// redelivered batch) are skipped, so a replay writes nothing.
//
// The stock row is locked first and its sale_epoch compared: a sale
// started or renumbered since makes the batch stale
// (inventory.ErrStaleSale), and nothing is written; a batch of a number the
// database does not have yet (a renumbering not committed yet) is
// ErrUnavailable, to be tried again. The deduction is unconditional: Redis
// accepted these orders against the same initial stock, so the database
// can only follow it, never refuse it.
func (s *Store) PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	written := 0
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		current, err := t.lockSale(ctx, sku)
		if errors.Is(err, inventory.ErrUnknownSKU) {
			return fmt.Errorf("%w: %q has no sale in the database", inventory.ErrStaleSale, sku)
		}
		if err != nil {
			return err
		}
		switch {
		case epoch < current:
			return fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d", inventory.ErrStaleSale, sku, current, epoch)
		case epoch > current:
			return fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d, not committed yet", inventory.ErrUnavailable, sku, current, epoch)
		}
		written, err = t.writeReserved(ctx, sku, orders)
		if err != nil {
			return err
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

// lockSale locks the SKU's stock row and reads its sale number.
func (t *tx) lockSale(ctx context.Context, sku string) (int64, error) {
	var current int64
	err := t.tx.QueryRowContext(ctx, `SELECT sale_epoch FROM stock WHERE sku = ? FOR UPDATE`, sku).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return current, wrap(ctx, err)
}

// writeReserved inserts the orders not written yet and deducts their total;
// the caller holds the stock row's lock, which serialises the writers of
// the SKU's orders, so the orders found here are all there will be.
func (t *tx) writeReserved(ctx context.Context, sku string, orders []inventory.Order) (int, error) {
	ids := make([]any, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	rows, err := t.tx.QueryContext(ctx, `SELECT id FROM orders WHERE id IN (`+placeholders(len(ids), "?")+`)`, ids...)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	there := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, wrap(ctx, err)
		}
		there[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, wrap(ctx, err)
	}
	var fresh []inventory.Order
	var total int64
	for _, o := range orders {
		if !there[o.ID] {
			fresh = append(fresh, o)
			total += o.Quantity
		}
	}
	if len(fresh) == 0 {
		return 0, nil
	}
	if _, err := t.InsertOrders(ctx, fresh); err != nil {
		return 0, err
	}
	if _, err := t.tx.ExecContext(ctx, `
		UPDATE stock SET available = available - ?, version = version + 1
		WHERE sku = ?`, total, sku); err != nil {
		return 0, wrap(ctx, err)
	}
	return len(fresh), nil
}

// RecheckSale runs check in one transaction that holds the SKU's stock row
// locked, so no batch of the SKU commits meanwhile and checks of several
// instances queue; it commits when check returns nil. check may read the
// sale's audit (Sale is its number), write orders as PersistReserved does
// (without comparing numbers), and renumber the sale (its stock and orders
// stay). ErrUnknownSKU when there is no row.
func (s *Store) RecheckSale(ctx context.Context, sku string, check func(ctx context.Context, r reservation.SaleRecheck) error) error {
	return s.inTx(ctx, func(ctx context.Context, t *tx) error {
		if _, err := t.lockSale(ctx, sku); err != nil {
			return err
		}
		return check(ctx, myRecheck{t: t, sku: sku})
	})
}

type myRecheck struct {
	t   *tx
	sku string
}

func (r myRecheck) Audit(ctx context.Context) (inventory.Audit, error) {
	a := inventory.Audit{SKU: r.sku}
	if err := r.t.tx.QueryRowContext(ctx, `SELECT initial, available, sale_epoch FROM stock WHERE sku = ?`, r.sku).Scan(&a.Initial, &a.Available, &a.Sale); err != nil {
		return a, wrap(ctx, err)
	}
	err := r.t.tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(quantity), 0), COUNT(*) FROM orders WHERE sku = ?`, r.sku).Scan(&a.Ordered, &a.Orders)
	return a, wrap(ctx, err)
}

func (r myRecheck) Write(ctx context.Context, orders []inventory.Order, keys []inventory.IdempotencyRecord) error {
	if _, err := r.t.writeReserved(ctx, r.sku, orders); err != nil {
		return err
	}
	if len(keys) > 0 {
		_, err := r.t.InsertIdempotencyRecords(ctx, keys)
		return err
	}
	return nil
}

func (r myRecheck) Renumber(ctx context.Context, to int64) error {
	_, err := r.t.tx.ExecContext(ctx, `UPDATE stock SET sale_epoch = ? WHERE sku = ?`, to, r.sku)
	return wrap(ctx, err)
}
