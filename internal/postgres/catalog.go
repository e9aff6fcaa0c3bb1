package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// StartCatalogWith implements inventory.Store: every start of c as
// StartSaleWith runs one, in one transaction and a statement per table.
// The upsert takes the rows in c.Starts' order (by SKU, the "C" collation
// is Go's byte order), so two catalogs that share SKUs queue on their
// first shared row instead of deadlocking, and an order holds one row.
func (s *Store) StartCatalogWith(ctx context.Context, c inventory.CatalogStart) ([]int64, error) {
	n := len(c.Starts)
	skus, units, atLeast := make([]string, n), make([]int64, n), make([]int64, n)
	starts, ends := make([]*time.Time, n), make([]*time.Time, n)
	index := make(map[string]int, n)
	for i, st := range c.Starts {
		skus[i], units[i], atLeast[i] = st.SKU, st.Available, st.AtLeast
		starts[i], ends[i] = timeOrNull(st.Window.StartsAt), timeOrNull(st.Window.EndsAt)
		index[st.SKU] = i
	}
	sales := make([]int64, n)
	err := s.inTx(ctx, func(ctx context.Context, t *tx) error {
		rows, err := t.tx.Query(ctx, `
			INSERT INTO stock (sku, initial, available, version, fence, sale_epoch, updated_at, starts_at, ends_at)
			SELECT u.sku, u.n, u.n, 0, 0, (u.at_least / 1048576 + 1) * 1048576, now(), u.starts_at, u.ends_at
			FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::timestamptz[], $5::timestamptz[])
			     WITH ORDINALITY AS u(sku, n, at_least, starts_at, ends_at, i)
			ORDER BY u.i
			ON CONFLICT (sku) DO UPDATE
			SET initial = EXCLUDED.initial, available = EXCLUDED.available, restocked = 0, version = stock.version + 1,
				sale_epoch = GREATEST(stock.sale_epoch / 1048576 + 1, EXCLUDED.sale_epoch / 1048576) * 1048576,
				updated_at = now(), starts_at = EXCLUDED.starts_at, ends_at = EXCLUDED.ends_at
			RETURNING sku, sale_epoch`, skus, units, atLeast, starts, ends)
		if err != nil {
			return wrap(ctx, err)
		}
		got := 0
		for rows.Next() {
			var sku string
			var sale int64
			if err := rows.Scan(&sku, &sale); err != nil {
				rows.Close()
				return wrap(ctx, err)
			}
			i, ok := index[sku]
			if !ok {
				rows.Close()
				return fmt.Errorf("catalog start: the upsert returned sku %q, not asked for", sku)
			}
			sales[i] = sale
			got++
		}
		if err := rows.Err(); err != nil {
			return wrap(ctx, err)
		}
		if got != n {
			return fmt.Errorf("catalog start: the upsert returned %d rows for %d SKUs", got, n)
		}
		for _, table := range []string{"orders", "buyer_units", "restocks", "idempotency_keys"} {
			if _, err := t.tx.Exec(ctx, `DELETE FROM `+table+` WHERE sku = ANY($1::text[])`, skus); err != nil {
				return wrap(ctx, err)
			}
		}
		return wrap(ctx, c.Finish(ctx, t, sales))
	})
	return sales, err
}

// SaleRows implements reservation.EpochSales: the stock rows of skus, by
// SKU; a SKU without one is absent.
func (s *Store) SaleRows(ctx context.Context, skus []string) (map[string]inventory.SaleRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT sku, initial, sale_epoch, starts_at, ends_at FROM stock WHERE sku = ANY($1::text[])`, skus)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	out := make(map[string]inventory.SaleRow, len(skus))
	for rows.Next() {
		var r inventory.SaleRow
		var starts, ends *time.Time
		if err := rows.Scan(&r.SKU, &r.Initial, &r.Sale, &starts, &ends); err != nil {
			return nil, wrap(ctx, err)
		}
		if starts != nil {
			r.Window.StartsAt = starts.UTC()
		}
		if ends != nil {
			r.Window.EndsAt = ends.UTC()
		}
		out[r.SKU] = r
	}
	return out, wrap(ctx, rows.Err())
}
