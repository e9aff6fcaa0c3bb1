package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
)

// DeductEach implements batched.Tx: the rows of skus are read and locked
// in the order given (SELECT … ORDER BY sku FOR UPDATE; ascii_bin is Go's
// byte order), and returned as read; then every SKU whose window is open
// and whose available covers its total is deducted by one UPDATE, which
// checks both again. An UPDATE has no RETURNING on MariaDB, hence the
// read; under the locks it cannot go stale. Both statements are held to
// the primary key's ranges (FORCE INDEX): on a small table the optimizer
// scanned it whole, and the UPDATE, under REPEATABLE READ, locked rows
// outside its list, out of order (found by
// TestBatchesAcrossSKUsNeverDeadlock: a deadlock).
func (t *tx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.deductEach(ctx, skus, totals, `
		SELECT sku, available, version, fence, `+windowState+` FROM stock FORCE INDEX (PRIMARY)
		WHERE sku IN (`+placeholders(len(skus), "?")+`) ORDER BY sku FOR UPDATE`, false)
}

// DeductEachSkippingHeld implements batched.Tx as DeductEach does, but
// the locking read skips the rows other transactions hold (SKIP LOCKED),
// so it never waits, and the UPDATE takes only the rows it locked. When
// it locked fewer rows than asked for, a plain (consistent, unlocking)
// read tells which of the others exist: those are held.
func (t *tx) DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.deductEach(ctx, skus, totals, `
		SELECT sku, available, version, fence, `+windowState+` FROM stock FORCE INDEX (PRIMARY)
		WHERE sku IN (`+placeholders(len(skus), "?")+`) ORDER BY sku FOR UPDATE SKIP LOCKED`, true)
}

// deductEach runs a locking read of skus' rows (lockRows, which skips
// held rows when skipsHeld), then deducts every total that fits in one
// UPDATE.
func (t *tx) deductEach(ctx context.Context, skus []string, totals []int64, lockRows string, skipsHeld bool) ([]batched.Deduction, error) {
	args := make([]any, len(skus))
	for i, sku := range skus {
		args[i] = sku
	}
	levels, err := t.readLevels(ctx, lockRows, args)
	if err != nil {
		return nil, err
	}
	var held map[string]inventory.Level
	if skipsHeld && len(levels) < len(skus) {
		var missing []any
		for _, sku := range skus {
			if _, ok := levels[sku]; !ok {
				missing = append(missing, sku)
			}
		}
		if held, err = t.readLevels(ctx, `
			SELECT sku, 0, 0, 0, 0 FROM stock FORCE INDEX (PRIMARY) WHERE sku IN (`+placeholders(len(missing), "?")+`)`, missing); err != nil {
			return nil, err
		}
	}
	out := make([]batched.Deduction, len(skus))
	var cases strings.Builder
	var caseArgs, fitArgs []any
	for i, sku := range skus {
		l, ok := levels[sku]
		out[i] = batched.Deduction{Exists: ok, Level: l}
		if _, isHeld := held[sku]; isHeld {
			out[i] = batched.Deduction{Exists: true, Held: true}
		}
		if !ok || l.Refusal(totals[i]) != nil {
			continue
		}
		out[i].Deducted = true
		cases.WriteString(" WHEN ? THEN ?")
		caseArgs = append(caseArgs, sku, totals[i])
		fitArgs = append(fitArgs, sku)
	}
	if len(fitArgs) == 0 {
		return out, nil
	}
	total := "CASE sku" + cases.String() + " END"
	query := `UPDATE stock FORCE INDEX (PRIMARY) SET available = available - ` + total + `, version = version + 1
		WHERE sku IN (` + placeholders(len(fitArgs), "?") + `) AND available >= ` + total + ` AND ` + openNow
	all := append(append(append([]any{}, caseArgs...), fitArgs...), caseArgs...)
	res, err := t.tx.ExecContext(ctx, query, all...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, wrap(ctx, err)
	}
	if int(n) != len(fitArgs) {
		// Under the row locks nothing else writes them; a window that
		// closed between the read and the UPDATE does this. The batch
		// must not commit: it runs again, and reads the window shut.
		return nil, fmt.Errorf("%w: deduct each: %d rows updated of %d read as fitting under their locks", inventory.ErrConflict, n, len(fitArgs))
	}
	return out, nil
}

// readLevels runs query, whose rows are sku, available, version, fence
// and window state, and returns them by SKU.
func (t *tx) readLevels(ctx context.Context, query string, args []any) (map[string]inventory.Level, error) {
	rows, err := t.tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	levels := make(map[string]inventory.Level, len(args))
	for rows.Next() {
		var sku string
		var l inventory.Level
		if err := rows.Scan(&sku, &l.Available, &l.Version, &l.Fence, &l.Window); err != nil {
			return nil, wrap(ctx, err)
		}
		levels[sku] = l
	}
	return levels, wrap(ctx, rows.Err())
}
