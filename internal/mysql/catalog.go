package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/flashsale/stock/internal/inventory"
)

// catalogChunk is the rows of one statement of a catalog's start: six
// placeholders a row, under the protocol's 65,535 a statement.
const catalogChunk = 1000

// StartCatalogWith implements inventory.Store: every start of c as
// StartSaleWith runs one, in one transaction, a statement per table and
// chunk. The upserts take the rows in c.Starts' order (by SKU: ascii_bin
// is Go's byte order), so two catalogs that share SKUs queue on their
// first shared row instead of deadlocking, and an order holds one row.
func (s *Store) StartCatalogWith(ctx context.Context, c inventory.CatalogStart) ([]int64, error) {
	n := len(c.Starts)
	index := make(map[string]int, n)
	for i, st := range c.Starts {
		index[st.SKU] = i
	}
	sales := make([]int64, n)
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		// Every stock row first, in SKU order, then the numbers and the
		// deletes: a chunk's deletes take gap locks in orders, and an
		// order holding a later chunk's stock row would wait on them
		// while the catalog waited on its row (found by review: a
		// deadlock with a plain order past 1,000 SKUs).
		for from := 0; from < n; from += catalogChunk {
			chunk := c.Starts[from:min(from+catalogChunk, n)]
			args := make([]any, 0, 6*len(chunk))
			for _, st := range chunk {
				args = append(args, st.SKU, st.Available, st.Available, st.AtLeast, utcOrNull(st.Window.StartsAt), utcOrNull(st.Window.EndsAt))
			}
			if _, err := t.tx.ExecContext(ctx, `
				INSERT INTO stock (sku, initial, available, version, fence, sale_epoch, updated_at, starts_at, ends_at)
				VALUES `+placeholders(len(chunk), `(?, ?, ?, 0, 0, (? DIV 1048576 + 1) * 1048576, CURRENT_TIMESTAMP(6), ?, ?)`)+`
				ON DUPLICATE KEY UPDATE
					initial = VALUES(initial), available = VALUES(available), restocked = 0, version = version + 1,
					sale_epoch = GREATEST(sale_epoch DIV 1048576 + 1, VALUES(sale_epoch) DIV 1048576) * 1048576,
					updated_at = CURRENT_TIMESTAMP(6), starts_at = VALUES(starts_at), ends_at = VALUES(ends_at)`, args...); err != nil {
				return wrap(ctx, err)
			}
		}
		for from := 0; from < n; from += catalogChunk {
			chunk := c.Starts[from:min(from+catalogChunk, n)]
			skus := make([]any, len(chunk))
			for i, st := range chunk {
				skus[i] = st.SKU
			}
			in := placeholders(len(chunk), "?")
			// The rows are locked by the upsert until the commit: this
			// reads the numbers this transaction wrote, a locking read
			// (no read view between the chunks).
			got, err := t.saleNumbers(ctx, in, skus, index, sales)
			if err != nil {
				return err
			}
			if got != len(chunk) {
				return fmt.Errorf("catalog start: %d rows read back for %d SKUs", got, len(chunk))
			}
			for _, table := range []string{"orders", "buyer_units", "restocks", "idempotency_keys"} {
				if _, err := t.tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE sku IN (`+in+`)`, skus...); err != nil {
					return wrap(ctx, err)
				}
			}
		}
		return wrap(ctx, c.Finish(ctx, t, sales))
	})
	return sales, err
}

// saleNumbers reads the sale numbers of the SKUs in skus (in, their
// placeholders) into sales at their index, and reports how many it read.
func (t *tx) saleNumbers(ctx context.Context, in string, skus []any, index map[string]int, sales []int64) (int, error) {
	rows, err := t.tx.QueryContext(ctx, `SELECT sku, sale_epoch FROM stock WHERE sku IN (`+in+`) FOR UPDATE`, skus...)
	if err != nil {
		return 0, wrap(ctx, err)
	}
	defer rows.Close()
	got := 0
	for rows.Next() {
		var sku string
		var sale int64
		if err := rows.Scan(&sku, &sale); err != nil {
			return got, wrap(ctx, err)
		}
		i, ok := index[sku]
		if !ok {
			return got, fmt.Errorf("catalog start: read back sku %q, not asked for", sku)
		}
		sales[i] = sale
		got++
	}
	return got, wrap(ctx, rows.Err())
}

// SaleRows implements reservation.EpochSales: the stock rows of skus, by
// SKU; a SKU without one is absent.
func (s *Store) SaleRows(ctx context.Context, skus []string) (map[string]inventory.SaleRow, error) {
	out := make(map[string]inventory.SaleRow, len(skus))
	for from := 0; from < len(skus); from += catalogChunk {
		chunk := skus[from:min(from+catalogChunk, len(skus))]
		args := make([]any, len(chunk))
		for i, sku := range chunk {
			args[i] = sku
		}
		if err := s.saleRows(ctx, chunk, args, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (s *Store) saleRows(ctx context.Context, chunk []string, args []any, out map[string]inventory.SaleRow) error {
	rows, err := s.db.QueryContext(ctx, `
		SELECT sku, initial, sale_epoch, starts_at, ends_at FROM stock WHERE sku IN (`+placeholders(len(chunk), "?")+`)`, args...)
	if err != nil {
		return wrap(ctx, err)
	}
	defer rows.Close()
	for rows.Next() {
		var r inventory.SaleRow
		var starts, ends sql.NullTime
		if err := rows.Scan(&r.SKU, &r.Initial, &r.Sale, &starts, &ends); err != nil {
			return wrap(ctx, err)
		}
		if starts.Valid {
			r.Window.StartsAt = starts.Time.UTC()
		}
		if ends.Valid {
			r.Window.EndsAt = ends.Time.UTC()
		}
		out[r.SKU] = r
	}
	return wrap(ctx, rows.Err())
}
