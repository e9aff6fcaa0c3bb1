package mysql

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"

	"github.com/flashsale/stock/internal/inventory"
)

// The order lifecycle's statements (inventory.Tx): each transition is one
// conditional UPDATE on the order row, judged by the database's clock
// (UTC_TIMESTAMP(6), the clock expires_at was written with).

// stateOf is the state a new order is written with: final unless it says
// otherwise.
func stateOf(o inventory.Order) string {
	if o.State == "" {
		return inventory.OrderFinal
	}
	return o.State
}

func (t *tx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	// Pay and cancel only while the hold runs, expiry only once it has
	// lapsed: the two sides of expires_at on one clock, so exactly one of a
	// racing pay and expiry matches. InnoDB's UPDATE reads the row's latest
	// version under its lock, so the second of two racing UPDATEs sees the
	// first one's state, whatever the transaction's snapshot. FORCE INDEX:
	// on a small table MariaDB may plan this on the sweep's index (state,
	// expires_at) and lock a range of other orders' entries, waiting behind
	// a sweep for an order the sweep does not touch.
	lapsed := `expires_at > UTC_TIMESTAMP(6)`
	if to == inventory.OrderExpired {
		lapsed = `expires_at <= UTC_TIMESTAMP(6)`
	}
	return t.execAffected(ctx, `
		UPDATE orders FORCE INDEX (PRIMARY) SET state = ?, settled_at = UTC_TIMESTAMP(6)
		WHERE id = ? AND user_id = ? AND state = 'held' AND `+lapsed, to, id, userID)
}

func (t *tx) ReturnUnits(ctx context.Context, sku string, quantity int64) error {
	ok, err := t.execAffected(ctx, `UPDATE stock SET available = available + ? WHERE sku = ?`, quantity, sku)
	if err == nil && !ok {
		err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, sku)
	}
	return err
}

func (t *tx) ExpireLapsed(ctx context.Context, limit int) ([]inventory.Order, error) {
	// Two steps, so that the sweep locks the orders it moves and nothing
	// else. A locking read over the index (state, expires_at) would, under
	// REPEATABLE READ, also lock the gap after the last lapsed hold, where
	// every new hold is inserted: orders would queue behind the sweep, and
	// deadlock with it. So: a plain read of candidates (no locks), then the
	// candidates by primary key, locked, skipping those another
	// transaction holds (a pay, a cancel, a second sweeper), still held and
	// lapsed; then the move of exactly those.
	rows, err := t.tx.QueryContext(ctx, `
		SELECT id FROM orders
		WHERE state = 'held' AND expires_at <= UTC_TIMESTAMP(6)
		ORDER BY expires_at LIMIT ?`, limit)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	var candidates []any
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			_ = rows.Close()
			return nil, wrap(ctx, err)
		}
		candidates = append(candidates, id)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	if len(candidates) == 0 {
		return nil, nil
	}
	rows, err = t.tx.QueryContext(ctx, `
		SELECT id, sku, quantity, user_id, claimed FROM orders FORCE INDEX (PRIMARY)
		WHERE id IN (`+placeholders(len(candidates), "?")+`) AND state = 'held' AND expires_at <= UTC_TIMESTAMP(6)
		FOR UPDATE SKIP LOCKED`, candidates...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	var expired []inventory.Order
	for rows.Next() {
		o := inventory.Order{State: inventory.OrderExpired}
		if err := rows.Scan(&o.ID, &o.SKU, &o.Quantity, &o.UserID, &o.Claimed); err != nil {
			_ = rows.Close()
			return nil, wrap(ctx, err)
		}
		expired = append(expired, o)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(ctx, err)
	}
	if len(expired) == 0 {
		return nil, nil
	}
	args := make([]any, len(expired))
	for i, o := range expired {
		args[i] = o.ID
	}
	res, err := t.tx.ExecContext(ctx, `
		UPDATE orders FORCE INDEX (PRIMARY) SET state = 'expired', settled_at = UTC_TIMESTAMP(6)
		WHERE state = 'held' AND id IN (`+placeholders(len(expired), "?")+`)`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	// The rows are locked since the SELECT: every one must still be held.
	if n, err := res.RowsAffected(); err != nil || n != int64(len(expired)) {
		return nil, fmt.Errorf("mysql: expiring %d locked holds changed %d rows: %w", len(expired), n, err)
	}
	return expired, nil
}

func (t *tx) ClaimUnits(ctx context.Context, sku, userID string, quantity, limit int64) (bool, error) {
	if quantity > limit {
		return false, nil
	}
	// Affected rows: 1 for a new buyer row, 2 for one that grew, 0 for one
	// left as it was (the limit reached). An order of the same buyer on
	// another instance waits for this transaction's row lock, and the
	// update reads the row's latest version under it.
	return t.execAffected(ctx, `
		INSERT INTO buyer_units (sku, user_id, units) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE units = IF(units + ? <= ?, units + ?, units)`,
		sku, userID, quantity, quantity, limit, quantity)
}

func (t *tx) ReleaseUnits(ctx context.Context, sku, userID string, quantity int64) error {
	// quantity is what the order claimed, so the count stays at what the
	// buyer's other counted orders hold and the floor never binds. It is
	// kept for rows a version before orders.claimed wrote during a
	// rolling deploy: a count a step too low there must never make a
	// cancel, or the sweep whose batch holds it, fail.
	_, err := t.tx.ExecContext(ctx, `
		UPDATE buyer_units SET units = GREATEST(units - ?, 0) WHERE sku = ? AND user_id = ?`, quantity, sku, userID)
	return wrap(ctx, err)
}

func (t *tx) LockBuyers(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	// Two reads. A locking read of a buyer row that does not exist yet
	// would gap-lock its place on InnoDB, and two instances' batches of one
	// new buyer then deadlock (each holds a gap the other's claim inserts
	// into, while one waits for the other's stock row; the schedule
	// explorer found it). So: a plain read finds the buyers that have a
	// row, and only those rows are locked (record locks, no gaps). A buyer
	// without one is inserted by ClaimUnitsOf with a plain INSERT, which a
	// row created meanwhile refuses.
	read := func(users []string, lock string) (map[string]int64, error) {
		return readBuyerUnits(ctx, t.tx, sku, users, lock, func(u string) string { return u })
	}
	found, err := read(userIDs, "")
	if err != nil || len(found) == 0 {
		return found, err
	}
	existing := make([]string, 0, len(found))
	for u := range found {
		existing = append(existing, u)
	}
	slices.Sort(existing)
	return read(existing, " ORDER BY user_id FOR UPDATE")
}

// BuyerUnits implements inventory.Store: one plain read of the primary
// key, outside any transaction, locking nothing. The PAD SPACE collation
// finds the rows of ids that differ only by trailing spaces (written before
// such ids were refused) with the one asked for: their units are summed
// under its spelling, as the store's claim counts them on that one row.
func (s *Store) BuyerUnits(ctx context.Context, sku string, userIDs []string) (map[string]int64, error) {
	return readBuyerUnits(ctx, s.db, sku, userIDs, "", func(u string) string { return strings.TrimRight(u, " ") })
}

// readBuyerUnits reads the units of users in sku's sale (the query ends
// with suffix: a lock, or nothing), summed by key of each row's spelling.
func readBuyerUnits(ctx context.Context, q querier, sku string, users []string, suffix string, key func(string) string) (map[string]int64, error) {
	args := []any{sku}
	for _, u := range users {
		args = append(args, u)
	}
	rows, err := q.QueryContext(ctx, `
		SELECT user_id, units FROM buyer_units WHERE sku = ? AND user_id IN (`+placeholders(len(users), "?")+`)`+suffix, args...)
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
		units[key(u)] += n
	}
	return units, wrap(ctx, rows.Err())
}

func (t *tx) ClaimFirstUnits(ctx context.Context, sku string, claims map[string]int64) ([]string, error) {
	users := make([]string, 0, len(claims))
	for u := range claims {
		users = append(users, u)
	}
	slices.Sort(users)
	args := make([]any, 0, 3*len(users))
	for _, u := range users {
		args = append(args, sku, u, claims[u])
	}
	// IGNORE skips the buyers that have a row (after waiting for a
	// transaction inserting the same one), and RETURNING names the rows
	// inserted. What else IGNORE would turn into a warning cannot happen
	// here: the user_id is validated to fit its column, and the units are
	// positive.
	rows, err := t.tx.QueryContext(ctx, `
		INSERT IGNORE INTO buyer_units (sku, user_id, units) VALUES `+placeholders(len(users), "(?, ?, ?)")+`
		RETURNING user_id`, args...)
	if err != nil {
		return nil, wrap(ctx, err)
	}
	defer rows.Close()
	var created []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, wrap(ctx, err)
		}
		created = append(created, u)
	}
	return created, wrap(ctx, rows.Err())
}

func (t *tx) ClaimUnitsOf(ctx context.Context, sku string, claims, held map[string]int64, limit int64) (bool, error) {
	var fresh, grown []string
	for u := range claims {
		if _, ok := held[u]; ok {
			grown = append(grown, u)
		} else {
			fresh = append(fresh, u)
		}
	}
	slices.Sort(fresh)
	slices.Sort(grown)
	if len(fresh) > 0 {
		// Buyers without a row: a plain INSERT, refused (duplicate key)
		// when another transaction created the row since LockBuyers read.
		args := make([]any, 0, 3*len(fresh))
		for _, u := range fresh {
			if claims[u] > limit {
				return false, nil
			}
			args = append(args, sku, u, claims[u])
		}
		_, err := t.tx.ExecContext(ctx, `
			INSERT INTO buyer_units (sku, user_id, units) VALUES `+placeholders(len(fresh), "(?, ?, ?)"), args...)
		var myErr *mysql.MySQLError
		if errors.As(err, &myErr) && myErr.Number == erDuplicateKey {
			return false, nil
		}
		if err != nil {
			return false, wrap(ctx, err)
		}
	}
	if len(grown) > 0 {
		// Buyers with a row, locked by LockBuyers since it read them: each
		// grows by its claim while it stays within the limit, and every
		// one must (one statement, one count: each matched row changes).
		var when strings.Builder
		var pairs []any
		for _, u := range grown {
			when.WriteString(" WHEN ? THEN ?")
			pairs = append(pairs, u, claims[u])
		}
		args := append([]any{}, pairs...)
		args = append(args, sku)
		for _, u := range grown {
			args = append(args, u)
		}
		args = append(args, pairs...)
		args = append(args, limit)
		res, err := t.tx.ExecContext(ctx, `
			UPDATE buyer_units SET units = units + CASE user_id`+when.String()+` END
			WHERE sku = ? AND user_id IN (`+placeholders(len(grown), "?")+`)
			  AND units + CASE user_id`+when.String()+` END <= ?`, args...)
		if err != nil {
			return false, wrap(ctx, err)
		}
		n, err := res.RowsAffected()
		if err != nil || n != int64(len(grown)) {
			return false, wrap(ctx, err)
		}
	}
	return true, nil
}

func (t *tx) ReturnEach(ctx context.Context, returns []inventory.Order) error {
	if len(returns) == 0 {
		return nil
	}
	var cases strings.Builder
	args := make([]any, 0, 3*len(returns))
	for _, r := range returns {
		cases.WriteString(" WHEN ? THEN ?")
		args = append(args, r.SKU, r.Quantity)
	}
	skus := make([]any, len(returns))
	for i, r := range returns {
		skus[i] = r.SKU
	}
	// One UPDATE held to the primary key's range: it locks the rows in
	// SKU order (ascii_bin is Go's byte order), as DeductEach takes them,
	// and nothing outside the list (see DeductEach). Every return adds at
	// least a unit, so every row it finds changes: fewer rows changed than
	// SKUs means a SKU without a row.
	res, err := t.tx.ExecContext(ctx, `
		UPDATE stock FORCE INDEX (PRIMARY) SET available = available + CASE sku`+cases.String()+` END
		WHERE sku IN (`+placeholders(len(returns), "?")+`)`, append(args, skus...)...)
	if err != nil {
		return wrap(ctx, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return wrap(ctx, err)
	}
	if int(n) == len(returns) {
		return nil
	}
	for _, r := range returns {
		if _, err := t.ReadLevel(ctx, r.SKU); err != nil {
			return err
		}
	}
	return fmt.Errorf("%w: %d of %d SKUs given units back", inventory.ErrUnknownSKU, n, len(returns))
}

func (t *tx) ReleaseEach(ctx context.Context, claims []inventory.Order) error {
	if len(claims) == 0 {
		return nil
	}
	// Ids that differ only in trailing spaces are one row (utf8mb4_bin
	// pads): their units are summed under one spelling, as in
	// ReleaseUnitsOf, or the CASE would give the row only its first
	// matching WHEN's (TestSweepGivesBackEveryClaimOfIdsMariaDBPadsToOneBuyer).
	type key struct{ sku, user string }
	units := make(map[key]int64, len(claims))
	for _, c := range claims {
		units[key{c.SKU, strings.TrimRight(c.UserID, " ")}] += c.Quantity
	}
	keys := make([]key, 0, len(units))
	for k := range units {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b key) int {
		if c := strings.Compare(a.sku, b.sku); c != 0 {
			return c
		}
		return strings.Compare(a.user, b.user)
	})
	var when strings.Builder
	args := make([]any, 0, 5*len(keys))
	for _, k := range keys {
		when.WriteString(" WHEN sku = ? AND user_id = ? THEN ?")
		args = append(args, k.sku, k.user, units[k])
	}
	for _, k := range keys {
		args = append(args, k.sku, k.user)
	}
	// (sku, user_id) IN a list of pairs, held to the primary key: a range
	// scan in (SKU, buyer) order, the order every transaction takes
	// buyers in. No row, nothing to give back.
	_, err := t.tx.ExecContext(ctx, `
		UPDATE buyer_units FORCE INDEX (PRIMARY) SET units = GREATEST(units - CASE`+when.String()+` ELSE 0 END, 0)
		WHERE (sku, user_id) IN (`+placeholders(len(keys), "(?, ?)")+`)`, args...)
	return wrap(ctx, err)
}

func (t *tx) ReleaseUnitsOf(ctx context.Context, sku string, units map[string]int64) error {
	// user_id is utf8mb4_bin, which pads with spaces: ids that differ
	// only in trailing spaces are one row (one buyer, as ClaimUnits counts
	// them). Their units are summed under one spelling, or the CASE would
	// give the row only the first WHEN's (found by review:
	// TestSweepGivesBackEveryOrderOfBuyersWhoShareARow).
	padded := make(map[string]int64, len(units))
	for u, q := range units {
		padded[strings.TrimRight(u, " ")] += q
	}
	units = padded
	users := make([]string, 0, len(units))
	for u := range units {
		users = append(users, u)
	}
	slices.Sort(users)
	var when strings.Builder
	var args []any
	for _, u := range users {
		when.WriteString(" WHEN ? THEN ?")
		args = append(args, u, units[u])
	}
	args = append(args, sku)
	for _, u := range users {
		args = append(args, u)
	}
	// Rows a batch claimed earlier in this transaction (locked by it
	// already), or a sweep's buyers: (sku, user_id) IN a list is a range
	// scan of the primary key, so the rows are locked in buyer order. No
	// row, nothing to give back, as in ReleaseUnits.
	_, err := t.tx.ExecContext(ctx, `
		UPDATE buyer_units SET units = GREATEST(units - CASE user_id`+when.String()+` END, 0)
		WHERE sku = ? AND user_id IN (`+placeholders(len(users), "?")+`)`, args...)
	return wrap(ctx, err)
}
