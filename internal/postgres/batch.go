package postgres

import (
	"context"
	"fmt"
)

// DeductEach implements batched.Tx, in one statement: the rows of skus
// are locked in the order given (the CTE's ORDER BY … FOR UPDATE: a
// join's own order is the heap's or a hash's, which two batches could
// take in opposite orders), then each SKU whose window is open and whose
// available covers its total is deducted. READ COMMITTED re-reads a row a
// concurrent writer committed before the UPDATE checks it.
func (t *tx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]bool, error) {
	rows, err := t.tx.Query(ctx, `
		WITH want AS (
			SELECT * FROM unnest($1::text[], $2::bigint[]) AS w (sku, total)
		), locked AS (
			SELECT sku FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku COLLATE "C" FOR UPDATE
		)
		UPDATE stock s SET available = s.available - w.total, version = s.version + 1
		FROM want w
		WHERE s.sku = w.sku AND s.sku IN (SELECT sku FROM locked) AND s.available >= w.total AND `+openNow+`
		RETURNING s.sku`, skus, totals)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	index := make(map[string]int, len(skus))
	for i, sku := range skus {
		index[sku] = i
	}
	fitted := make([]bool, len(skus))
	for rows.Next() {
		var sku string
		if err := rows.Scan(&sku); err != nil {
			return nil, wrap(ctx, err)
		}
		i, ok := index[sku]
		if !ok {
			return nil, fmt.Errorf("deduct each: updated sku %q, not asked for", sku)
		}
		fitted[i] = true
	}
	return fitted, wrap(ctx, rows.Err())
}
