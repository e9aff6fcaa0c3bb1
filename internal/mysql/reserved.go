package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
)

// PersistReserved writes orders that the redis-reserve strategy accepted in
// Redis during sale epoch (reservation.PersistOne).
func (s *Store) PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	return reservation.PersistOne(ctx, s, sku, epoch, orders, keys)
}

// PersistReservedEach implements reservation.Sink in one transaction: the
// batches' stock rows are locked in SKU order (ascii_bin is Go's byte
// order: two consumers whose batches share SKUs queue, never deadlock) and
// their sales read, then reservation.WriteJudged writes what is of the
// current sale. The deduction is unconditional: Redis accepted these
// orders against the same initial stock, so the database can only follow
// it, never refuse it.
func (s *Store) PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	var outcomes []reservation.SaleBatchOutcome
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		skus := reservation.BatchSKUs(batches)
		args := make([]any, len(skus))
		for i, sku := range skus {
			args[i] = sku
		}
		// FORCE INDEX (PRIMARY): on a small table the optimizer scans it
		// whole and locks rows outside the list (see DeductEach).
		rows, err := t.tx.QueryContext(ctx, `
			SELECT sku, sale_epoch FROM stock FORCE INDEX (PRIMARY) WHERE sku IN (`+placeholders(len(skus), "?")+`) ORDER BY sku FOR UPDATE`, args...)
		if err != nil {
			return wrap(ctx, err)
		}
		current := map[string]int64{}
		for rows.Next() {
			var sku string
			var epoch int64
			if err := rows.Scan(&sku, &epoch); err != nil {
				rows.Close()
				return wrap(ctx, err)
			}
			current[sku] = epoch
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return wrap(ctx, err)
		}
		outcomes, err = reservation.WriteJudged(batches, current, func(orders []inventory.Order, keys []inventory.IdempotencyRecord) (map[string]int, error) {
			return t.writeReserved(ctx, orders, keys)
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	return outcomes, nil
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

// writeReserved inserts the orders not written yet, deducts each SKU's
// total and stores the idempotency records; it returns how many orders of
// each SKU it wrote. The caller holds the SKUs' stock rows locked, which
// serialises the writers of their orders, so the orders found here are
// all there will be.
func (t *tx) writeReserved(ctx context.Context, orders []inventory.Order, keys []inventory.IdempotencyRecord) (map[string]int, error) {
	ids := make([]any, len(orders))
	for i, o := range orders {
		ids[i] = o.ID
	}
	rows, err := t.tx.QueryContext(ctx, `SELECT id FROM orders WHERE id IN (`+placeholders(len(ids), "?")+`)`, ids...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	there := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, wrap(ctx, err)
		}
		there[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	var (
		fresh   []inventory.Order
		skus    []string
		totals  = map[string]int64{}
		written = map[string]int{}
	)
	for _, o := range orders {
		if there[o.ID] {
			continue
		}
		fresh = append(fresh, o)
		if _, seen := totals[o.SKU]; !seen {
			skus = append(skus, o.SKU)
		}
		totals[o.SKU] += o.Quantity
		written[o.SKU]++
	}
	if len(fresh) > 0 {
		if _, err := t.InsertOrders(ctx, fresh); err != nil {
			return nil, err
		}
		var cases strings.Builder
		var caseArgs, in []any
		for _, sku := range skus {
			cases.WriteString(" WHEN ? THEN ?")
			caseArgs = append(caseArgs, sku, totals[sku])
			in = append(in, sku)
		}
		if _, err := t.tx.ExecContext(ctx, `
			UPDATE stock FORCE INDEX (PRIMARY) SET available = available - CASE sku`+cases.String()+` END, version = version + 1
			WHERE sku IN (`+placeholders(len(in), "?")+`)`, append(caseArgs, in...)...); err != nil {
			return nil, wrap(ctx, err)
		}
	}
	if len(keys) > 0 {
		// A key that exists already belongs to an order written before
		// (this batch's earlier delivery): nothing to add.
		if _, err := t.InsertIdempotencyRecords(ctx, reservation.KeysInOrder(keys)); err != nil {
			return nil, err
		}
	}
	return written, nil
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
	_, err := r.t.writeReserved(ctx, orders, keys)
	return err
}

func (r myRecheck) Renumber(ctx context.Context, to int64) error {
	_, err := r.t.tx.ExecContext(ctx, `UPDATE stock SET sale_epoch = ? WHERE sku = ?`, to, r.sku)
	return wrap(ctx, err)
}
