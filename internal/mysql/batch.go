package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/flashsale/stock/internal/inventory"
)

// DeductEach implements batched.Tx: the rows of skus are read and locked
// in the order given (SELECT … ORDER BY sku FOR UPDATE; ascii_bin is Go's
// byte order), then every SKU whose window is open and whose available
// covers its total is deducted by one UPDATE, which checks both again. An
// UPDATE has no RETURNING on MariaDB, hence the read; under the locks it
// cannot go stale. Both statements are held to the primary key's ranges
// (FORCE INDEX): on a small table the optimizer scanned it whole, and the
// UPDATE, under REPEATABLE READ, locked rows outside its list, out of
// order (found by TestBatchesAcrossSKUsNeverDeadlock: a deadlock).
func (t *tx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]bool, error) {
	in := placeholders(len(skus), "?")
	args := make([]any, len(skus))
	for i, sku := range skus {
		args[i] = sku
	}
	rows, err := t.tx.QueryContext(ctx, `
		SELECT sku, available, `+windowState+` FROM stock FORCE INDEX (PRIMARY) WHERE sku IN (`+in+`) ORDER BY sku FOR UPDATE`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	levels := make(map[string]inventory.Level, len(skus))
	for rows.Next() {
		var sku string
		var l inventory.Level
		if err := rows.Scan(&sku, &l.Available, &l.Window); err != nil {
			rows.Close()
			return nil, wrap(ctx, err)
		}
		levels[sku] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	fitted := make([]bool, len(skus))
	var cases strings.Builder
	var caseArgs, fitArgs []any
	for i, sku := range skus {
		l, ok := levels[sku]
		if !ok || l.Refusal(totals[i]) != nil {
			continue
		}
		fitted[i] = true
		cases.WriteString(" WHEN ? THEN ?")
		caseArgs = append(caseArgs, sku, totals[i])
		fitArgs = append(fitArgs, sku)
	}
	if len(fitArgs) == 0 {
		return fitted, nil
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
	return fitted, nil
}
