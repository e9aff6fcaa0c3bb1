package postgres

import (
	"context"
	"fmt"

	"github.com/flashsale/stock/internal/batched"
)

// DeductEach implements batched.Tx, in one statement: the rows of skus
// are locked in the order given (the CTE's ORDER BY … FOR UPDATE: a
// join's own order is the heap's or a hash's, which two batches could
// take in opposite orders), then each SKU whose window is open and whose
// available covers its total is deducted. READ COMMITTED re-reads a row a
// concurrent writer committed before the UPDATE checks it, as it does
// for the locking read, so the levels returned are the rows the UPDATE
// judged. Every locked row comes back, deducted or not, so the batch
// plans a SKU that did not fit again without reading it again.
func (t *tx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.deductEach(ctx, skus, `
		WITH want AS (
			SELECT * FROM unnest($1::text[], $2::bigint[]) AS w (sku, total)
		), locked AS (
			SELECT sku, available, version, fence, `+windowCase+` AS window_state
			FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku COLLATE "C" FOR UPDATE
		), deducted AS (
			UPDATE stock s SET available = s.available - w.total, version = s.version + 1
			FROM want w
			WHERE s.sku = w.sku AND s.sku IN (SELECT sku FROM locked) AND s.available >= w.total AND `+openNow+`
			RETURNING s.sku
		)
		SELECT l.sku, false, l.available, l.version, l.fence, l.window_state, d.sku IS NOT NULL
		FROM locked l LEFT JOIN deducted d ON d.sku = l.sku`, totals)
}

// DeductEachSkippingHeld implements batched.Tx as DeductEach does, but
// the locking read skips the rows other transactions hold (SKIP LOCKED),
// so the statement never waits; the UPDATE takes only rows it locked.
// Which of the rows it did not lock exist is read from the statement's
// snapshot: a row is held, or there is none.
func (t *tx) DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.deductEach(ctx, skus, `
		WITH want AS (
			SELECT * FROM unnest($1::text[], $2::bigint[]) AS w (sku, total)
		), locked AS (
			SELECT sku, available, version, fence, `+windowCase+` AS window_state
			FROM stock WHERE sku = ANY($1::text[]) ORDER BY sku COLLATE "C" FOR UPDATE SKIP LOCKED
		), deducted AS (
			UPDATE stock s SET available = s.available - w.total, version = s.version + 1
			FROM want w
			WHERE s.sku = w.sku AND s.sku IN (SELECT sku FROM locked) AND s.available >= w.total AND `+openNow+`
			RETURNING s.sku
		)
		SELECT s.sku, l.sku IS NULL, coalesce(l.available, 0), coalesce(l.version, 0), coalesce(l.fence, 0),
		       coalesce(l.window_state, 0), d.sku IS NOT NULL
		FROM stock s LEFT JOIN locked l ON l.sku = s.sku LEFT JOIN deducted d ON d.sku = s.sku
		WHERE s.sku = ANY($1::text[])`, totals)
}

// deductEach runs one of DeductEach's statements, whose rows are each a
// row of stock it read: sku, held, the level, deducted.
func (t *tx) deductEach(ctx context.Context, skus []string, query string, totals []int64) ([]batched.Deduction, error) {
	rows, err := t.tx.Query(ctx, query, skus, totals)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	index := make(map[string]int, len(skus))
	for i, sku := range skus {
		index[sku] = i
	}
	out := make([]batched.Deduction, len(skus))
	for rows.Next() {
		var sku string
		var d batched.Deduction
		if err := rows.Scan(&sku, &d.Held, &d.Level.Available, &d.Level.Version, &d.Level.Fence, &d.Level.Window, &d.Deducted); err != nil {
			return nil, wrap(ctx, err)
		}
		i, ok := index[sku]
		if !ok {
			return nil, fmt.Errorf("deduct each: read sku %q, not asked for", sku)
		}
		d.Exists = true
		out[i] = d
	}
	return out, wrap(ctx, rows.Err())
}
