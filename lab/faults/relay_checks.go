package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// relaySnapshot is what catchRelay saw at the moment it chose.
type relaySnapshot struct{ marked, expired, held int }

// catchRelay waits for the sweep to be half done with sku's latest burst
// (some of it expired since the call, some still held) and, within that,
// for a moment when the database holds orders marked for the relay:
// returns committed and not yet given to Redis (the relay runs right after
// each commit, so a mark lives a few milliseconds unless Redis is slow).
// It polls every 2ms. It reports false when the whole burst was swept and
// relayed before it could choose; seen half done for 1.5 s without a mark,
// it takes that moment anyway.
func catchRelay(ctx context.Context, db *lcDB, sku string) (bool, relaySnapshot, error) {
	q := `SELECT (SELECT count(*) FROM orders WHERE relay_pending),
		(SELECT count(*) FROM orders WHERE sku = ` + db.param(1) + ` AND state = 'expired'),
		(SELECT count(*) FROM orders WHERE sku = ` + db.param(2) + ` AND state = 'held')`
	read := func() (relaySnapshot, error) {
		var s relaySnapshot
		err := db.queryRow(ctx, q, []any{sku, sku}, &s.marked, &s.expired, &s.held)
		return s, err
	}
	base, err := read()
	if err != nil {
		return false, base, err
	}
	deadline := time.Now().Add(15 * time.Second)
	var halfSince time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s, err := read()
		if err != nil {
			return false, s, err
		}
		s.expired -= base.expired
		switch {
		case s.expired > 0 && s.marked > 0:
			return true, s, nil
		case s.expired > 0 && s.held == 0:
			return false, s, nil
		case s.expired > 0 && halfSince.IsZero():
			halfSince = time.Now()
		case s.expired > 0 && time.Since(halfSince) > 1500*time.Millisecond:
			return true, s, nil
		}
		pause(ctx, 2*time.Millisecond)
	}
	return false, relaySnapshot{}, ctx.Err()
}

// pollEvery polls cond every interval until it holds, ctx ends or timeout
// passes; it reports whether cond held.
func pollEvery(ctx context.Context, timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		pause(ctx, interval)
	}
	return true
}

// waitRelayed returns how long after from (the load's clock) none of ids
// (orders and restocks marked when Redis came back) was marked any more;
// nil when some still were 30 s after.
func waitRelayed(ctx context.Context, dbURL string, ids []string, l *lcLoad, from time.Duration) *float64 {
	db, err := openLcDB(ctx, dbURL)
	if err != nil {
		return nil
	}
	defer db.close()
	want := map[string]bool{}
	for _, id := range ids {
		want[strings.ToLower(id)] = true
	}
	var at *float64
	pollEvery(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
		still := false
		for _, table := range []string{"orders", "restocks"} {
			marked, err := db.markedIDs(ctx, table)
			if err != nil {
				return false
			}
			for _, id := range marked {
				still = still || want[strings.ToLower(id)]
			}
		}
		if !still {
			s := seconds(l.now() - from)
			at = &s
		}
		return !still
	})
	return at
}

// markedIDs lists the ids of table's rows marked for the relay (orders
// or restocks).
func (d *lcDB) markedIDs(ctx context.Context, table string) ([]string, error) {
	if d.pg != nil {
		return d.stringList(ctx, `SELECT id::text FROM `+table+` WHERE relay_pending`)
	}
	return d.stringList(ctx, `SELECT id FROM `+table+` WHERE relay_pending`)
}

func (d *lcDB) stringList(ctx context.Context, q string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d.pg != nil {
		rows, _ := d.pg.Query(ctx, q)
		return pgx.CollectRows(rows, pgx.RowTo[string])
	}
	rows, err := d.my.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// restockRow sums the restock rows of a SKU.
type restockRow struct{ rows, units, marked int64 }

func (d *lcDB) restockRows(ctx context.Context) (map[string]restockRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	const q = `SELECT sku, count(*), COALESCE(sum(quantity), 0), COALESCE(sum(CASE WHEN relay_pending THEN 1 ELSE 0 END), 0) FROM restocks GROUP BY sku`
	out := map[string]restockRow{}
	var sku string
	var s restockRow
	if d.pg != nil {
		rows, _ := d.pg.Query(ctx, q)
		_, err := pgx.ForEachRow(rows, []any{&sku, &s.rows, &s.units, &s.marked}, func() error {
			out[sku] = s
			return nil
		})
		return out, err
	}
	rows, err := d.my.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&sku, &s.rows, &s.units, &s.marked); err != nil {
			return nil, err
		}
		out[sku] = s
	}
	return out, rows.Err()
}

// readAudits reads GET /admin/audit/{sku} of each SKU, into T (the
// audit's fields a scenario checks).
func readAudits[T any](ctx context.Context, r *run, skus []string) (map[string]T, error) {
	out := map[string]T{}
	for _, sku := range skus {
		var a T
		if err := r.cluster.adminCall(ctx, http.MethodGet, "/admin/audit/"+sku, "", &a); err != nil {
			return nil, fmt.Errorf("audit %s: %w", sku, err)
		}
		out[sku] = a
	}
	return out, nil
}

// redisSale is a SKU's sale as Redis holds it: the sale hash's counts,
// the orders it took back (the set {sku}:returned), the restocks it took
// ({sku}:restocks) and the buyers' counts ({sku}:buyers).
type redisSale struct {
	available, ordered, orders, returned, returns, restocked int64
	returnedIDs                                              map[string]bool
	restocks                                                 int64
	buyers                                                   map[string]int64
}

func readRedisSale(ctx context.Context, addr, sku string) (redisSale, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 3})
	defer rc.Close()
	base := reserveKeyPrefix + "{" + sku + "}:"
	h, err := rc.HGetAll(ctx, base+"sale").Result()
	if err != nil {
		return redisSale{}, err
	}
	if len(h) == 0 {
		return redisSale{}, fmt.Errorf("no sale hash %ssale", base)
	}
	num := func(k string) int64 {
		n, _ := strconv.ParseInt(h[k], 10, 64)
		return n
	}
	s := redisSale{available: num("available"), ordered: num("ordered"), orders: num("orders"),
		returned: num("returned"), returns: num("returns"), restocked: num("restocked"),
		returnedIDs: map[string]bool{}, buyers: map[string]int64{}}
	ids, err := rc.SMembers(ctx, base+"returned").Result()
	if err != nil {
		return redisSale{}, err
	}
	for _, id := range ids {
		s.returnedIDs[strings.ToLower(id)] = true
	}
	if s.restocks, err = rc.SCard(ctx, base+"restocks").Result(); err != nil {
		return redisSale{}, err
	}
	b, err := rc.HGetAll(ctx, base+"buyers").Result()
	if err != nil {
		return redisSale{}, err
	}
	for user, v := range b {
		n, _ := strconv.ParseInt(v, 10, 64)
		s.buyers[user] = n
	}
	return s, nil
}

// checkNotYetWritten takes out of ops the pays, cancels and reads answered
// 404 for an order answered 201: an order of the reservation strategies is
// not found until its stream writes it (docs/api.md), which waits for a
// Redis that is down. Such an answer did nothing; it is accepted only if
// the row was written (its expires_at less the hold, the database's clock)
// no earlier than a second before the request was sent — the lookup waits
// a second for it — and fails the run otherwise.
func (r *run) checkNotYetWritten(ops []lcOp, l *lcLoad, t *lcTables, ttl time.Duration) []lcOp {
	byID := map[string]lcRow{}
	for _, row := range t.orders {
		byID[row.ID] = row
	}
	var kept []lcOp
	var wrong []string
	for _, op := range ops {
		if op.Kind == lcOrder || op.Status != http.StatusNotFound {
			kept = append(kept, op)
			continue
		}
		r.res.Relay.NotYetWritten++
		row, ok := byID[op.OrderID]
		if !ok {
			continue // its 201 without a row fails the rows' check
		}
		written := row.Expires - ttl.Microseconds()
		if call := l.wall(op.Call); call > written+time.Second.Microseconds() {
			wrong = append(wrong, fmt.Sprintf("%s of %s answered 404 %s, its row written %.3fs before the request",
				op.Kind, op.OrderID, op.Code, float64(call-written)/1e6))
		}
	}
	if len(wrong) > 0 {
		r.fail("%d pays, cancels or reads were answered 404 for an order written before them: %s", len(wrong), sample(wrong))
	}
	if n := r.res.Relay.NotYetWritten; n > 0 {
		r.note("%d pays, cancels or reads were answered 404 for an order answered 201 and not yet written (its stream waited for Redis)", n)
	}
	return kept
}

// checkRedisAgainstRows compares, SKU by SKU, Redis's sale with the rows:
// its available the stock row's; every order it took a row (and no row
// more); the orders it took back exactly the cancelled and expired rows,
// each once; its restocks the restock rows.
func (r *run) checkRedisAgainstRows(t *lcTables, restocks map[string]restockRow, sales map[string]redisSale) {
	rf := r.res.Relay
	type rowSums struct{ orders, units, returns, returned int64 }
	rows := map[string]*rowSums{}
	returned := map[string]map[string]bool{}
	for _, o := range t.orders {
		if rows[o.SKU] == nil {
			rows[o.SKU], returned[o.SKU] = &rowSums{}, map[string]bool{}
		}
		s := rows[o.SKU]
		s.orders++
		s.units += o.Quantity
		if o.State == "cancelled" || o.State == "expired" {
			s.returns++
			s.returned += o.Quantity
			returned[o.SKU][strings.ToLower(o.ID)] = true
		}
	}
	for _, sku := range slices.Sorted(maps.Keys(sales)) {
		s, st, rs := sales[sku], t.stock[sku], rows[sku]
		if rs == nil {
			rs = &rowSums{}
		}
		rk := restocks[sku]
		rf.RedisAvailable += s.available
		rf.DBAvailable += st.Available
		rf.RedisOrders += s.orders
		rf.DBOrders += rs.orders
		rf.RedisReturnedUnits += s.returned
		rf.DBReturnedUnits += rs.returned
		rf.RedisReturnedOrders += s.returns
		rf.RedisReturnedSet += int64(len(s.returnedIDs))
		rf.DBReturnedOrders += rs.returns
		rf.RedisRestocked += s.restocked
		rf.DBRestocked += rk.units
		if s.available != st.Available {
			r.fail("%s: Redis has %d units available, the database %d", sku, s.available, st.Available)
		}
		if s.orders != rs.orders || s.ordered != rs.units {
			r.fail("%s: Redis took %d orders of %d units, the database has %d rows of %d", sku, s.orders, s.ordered, rs.orders, rs.units)
		}
		var missing, extra []string
		for id := range returned[sku] {
			if !s.returnedIDs[id] {
				missing = append(missing, id)
			}
		}
		for id := range s.returnedIDs {
			if !returned[sku][id] {
				extra = append(extra, id)
			}
		}
		rf.ReturnsMissing += len(missing)
		rf.ReturnsExtra += len(extra)
		if len(missing) > 0 {
			r.fail("%s: %d cancelled or expired orders never reached Redis (returns lost): %s", sku, len(missing), sample(missing))
		}
		if len(extra) > 0 {
			r.fail("%s: Redis took back %d orders the database did not return: %s", sku, len(extra), sample(extra))
		}
		if s.returned != rs.returned || s.returns != rs.returns || s.returns != int64(len(s.returnedIDs)) {
			r.fail("%s: Redis took back %d units of %d orders (its set holds %d), the database returned %d units of %d orders: a return applied %s",
				sku, s.returned, s.returns, len(s.returnedIDs), rs.returned, rs.returns,
				map[bool]string{true: "twice", false: "never"}[s.returned > rs.returned])
		}
		if s.restocked != st.Restocked || s.restocked != rk.units || s.restocks != rk.rows {
			r.fail("%s: Redis was restocked %d units (%d restocks), the database %d (stock row) and %d in %d restock rows",
				sku, s.restocked, s.restocks, st.Restocked, rk.units, rk.rows)
		}
	}
	switch {
	case rf.RestockAnswer != "200" && rf.DBRestocked == rf.RestockUnits:
		// The service committed the restock, then failed to read the
		// level from Redis for its answer: the answer says nothing was
		// done and invites a retry, which would restock twice.
		r.warn("the restock sent while Redis was down was answered %q, yet it committed: its %d units are in the database's restock rows and reached Redis through the relay (an admin who retries, as the answer says, restocks twice)",
			rf.RestockAnswer, rf.DBRestocked)
	case rf.RestockAnswer == "200" && rf.DBRestocked != rf.RestockUnits:
		r.fail("the restock sent while Redis was down was answered 200, and the database holds %d restocked units of the %d", rf.DBRestocked, rf.RestockUnits)
	case rf.DBRestocked != rf.RestockUnits:
		r.note("the restock sent while Redis was down (answered %s) left %d units in restock rows", rf.RestockAnswer, rf.DBRestocked)
	}
}

// redisKillAvailability checks what the Redis kill of scenario 12 expects
// beyond lifecycleAvailability: no 201 while Redis is down (tk to tr, the
// restart), some 503s then, every order answered within ORDER_TIMEOUT
// and a second, pays and cancels answered by the database meanwhile.
func (r *run) redisKillAvailability(ops []lcOp, tk, tr, tu, end time.Duration) {
	rf := r.res.Relay
	conflicts := map[string]int{}
	for _, op := range ops {
		if op.Call < tk || op.Call >= tu {
			continue
		}
		switch op.Kind {
		case lcOrder:
			rf.DownOrders++
			if op.Status == http.StatusCreated && op.Ret < tr {
				rf.DownCreated++
			}
			if op.Status == http.StatusConflict && op.Ret < tr {
				rf.Down409++
				conflicts[op.Code]++
			}
			if op.Ret >= tr {
				rf.DownWaited++
			}
			if op.Status == http.StatusServiceUnavailable {
				rf.Down503++
			}
			if op.Answer == lcUnknown {
				rf.DownUnknown++
			}
			rf.DownSlowestS = max(rf.DownSlowestS, seconds(op.Ret-op.Call))
		case lcPay, lcCancel:
			rf.DownSettles++
			if lcSaid(op) != "" {
				rf.DownSettled++
			}
		}
	}
	if rf.DownCreated > 0 {
		r.fail("%d orders were answered 201 while Redis was down", rf.DownCreated)
	}
	if rf.Down503 == 0 {
		r.warn("no 503 to an order called while Redis was down")
	}
	if rf.Down409 > 0 {
		r.note("%d orders called while Redis was down were answered 409 before its restart (%v)", rf.Down409, conflicts)
	}
	if rf.DownSlowestS > 4 {
		r.warn("an order called while Redis was down took %.2fs to be answered, over ORDER_TIMEOUT (3s) and a second", rf.DownSlowestS)
	}
	if rf.DownSettles > 0 && rf.DownSettled == 0 {
		r.warn("none of the %d pays and cancels called while Redis was down was answered with the order's state (they are the database's)", rf.DownSettles)
	}
	first := -1.0
	for _, op := range ops {
		if op.Kind == lcOrder && op.Status == http.StatusCreated && op.Call >= tu && (first < 0 || seconds(op.Ret-tu) < first) {
			first = seconds(op.Ret - tu)
		}
	}
	rf.AfterFirst201S = first
	after := lcFigures(ops, tu, end+time.Hour)
	rf.After503 = after.Responses503
}

// relayLogs counts the instances' log lines about the relay and the
// errors, for the report.
func (r *run) relayLogs() {
	rf := r.res.Relay
	for i := range r.cluster.Instances {
		f, err := os.Open(filepath.Join(r.dir, fmt.Sprintf("instance-%d.log", i)))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.Contains(line, "not yet given back"):
				rf.LogRelayFailed++
			case strings.Contains(line, "gave Redis the returns or restocks it did not have yet"):
				rf.LogReturnAgain++
				var l struct{ Count int }
				if json.Unmarshal([]byte(line), &l) == nil {
					rf.LogReturnedAgain += l.Count
				}
			}
			if strings.Contains(line, "level=ERROR") || strings.Contains(line, `"level":"ERROR"`) {
				rf.LogErrors++
				if rf.LogFirstError == "" {
					rf.LogFirstError = fmt.Sprintf("instance %d: %.300s", i, line)
				}
			}
		}
		_ = f.Close()
	}
	if rf.LogReturnAgain > 0 {
		// The check of the restarted Redis gives it every return and
		// restock the database made that Redis's sets lack: the ones
		// still marked (in flight, never relayed) and any Redis lost.
		r.note("%d log lines (\"the check of the sale gave Redis the returns or restocks it did not have yet\") count %d returns and restocks given to Redis by the check after its restart; %d orders and %d restocks were marked for the relay a moment before it restarted (returns in flight; sweeps and cancels committed until the check add to them)",
			rf.LogReturnAgain, rf.LogReturnedAgain, rf.MarkedAtRestart, rf.RestocksAtRestart)
	}
}

// writeRelay writes what a run of scenario 12 did and found.
func writeRelay(p func(string, ...any), lf *LifecycleFigures, rf *RelayFigures) {
	p("HOLD_TTL=%s, PER_USER_LIMIT=1. Orders %d: 201 %d, sold out %d, limit reached %d. Pays %d: paid %d, expired %d. "+
		"Cancels %d: cancelled %d, expired %d. Reads %d. Unknown outcomes %d, 503s %d, refused %d.\n\n",
		lf.HoldTTL, lf.Orders, lf.Created, lf.SoldOut, lf.LimitReached, lf.Pays, lf.Paid, lf.PayExpired,
		lf.Cancels, lf.Cancelled, lf.CancelExpired, lf.Reads, lf.Unknown, lf.Responses503, lf.Refused)
	p("Kill: %d abandoned holds in %d bursts; at the kill %d orders were marked for the relay (returns committed, not yet in Redis), "+
		"the burst %d expired and %d held. Redis down %.2fs (its restart %.2fs of it). Restock of %d units while it was down: %s. "+
		"At the restart %d orders and %d restocks were marked; the last of them was relayed %s.\n\n",
		lf.BurstHolds, lf.Bursts, rf.MarkedAtKill, rf.BurstExpiredAtKill, rf.BurstHeldAtKill, rf.DownSeconds, rf.ReadySeconds,
		rf.RestockUnits, rf.RestockAnswer, rf.MarkedAtRestart, rf.RestocksAtRestart, relayedLine(rf.RelayedAfterS))
	p("While Redis was down: %d orders (201 before the restart %d, 409 before it %d, 503 %d, unknown %d, answered after the restart %d, slowest answer %.2fs); %d pays and cancels, %d answered with the order's state. "+
		"After it answered: first 201 after %.2fs, %d 503s; 201/s before %.1f, after %.1f. %d pays, cancels or reads answered 404 (order not yet written).\n\n",
		rf.DownOrders, rf.DownCreated, rf.Down409, rf.Down503, rf.DownUnknown, rf.DownWaited, rf.DownSlowestS, rf.DownSettles, rf.DownSettled,
		rf.AfterFirst201S, rf.After503, lf.CreatedPerSecondBefore, lf.CreatedPerSecondAfter, rf.NotYetWritten)
	p("Drain: %d held, %d pending, %d relaying after %.1fs. At the end, Redis / database: available %d / %d; orders %d / %d; "+
		"returned units %d / %d; returned orders %d (set %d) / %d, %d missing in Redis, %d extra; restocked %d / %d; %d buyer counts in Redis checked. "+
		"Rows: %d units on sale, %d paid, %d returned (%d orders expired, %d cancelled). Per-order check: %d orders, %d operations, %d illegal, %d unknown. "+
		"Logs: %d relays left units marked; %d rechecks gave Redis %d returns and restocks again (logged as lost by Redis); %d ERROR lines.\n\n",
		lf.HeldAtDrain, rf.DrainedPending, rf.DrainedRelaying, rf.DrainSeconds, rf.RedisAvailable, rf.DBAvailable, rf.RedisOrders, rf.DBOrders,
		rf.RedisReturnedUnits, rf.DBReturnedUnits, rf.RedisReturnedOrders, rf.RedisReturnedSet, rf.DBReturnedOrders, rf.ReturnsMissing, rf.ReturnsExtra,
		rf.RedisRestocked, rf.DBRestocked, rf.BuyerCounts, lf.InitialUnits, lf.PaidUnits, lf.ReturnedUnits, lf.ExpiredOrders, lf.CancelledOrders,
		lf.CheckedOrders, lf.CheckedOps, lf.IllegalOrders, lf.UnknownOrders, rf.LogRelayFailed, rf.LogReturnAgain, rf.LogReturnedAgain, rf.LogErrors)
	if rf.LogFirstError != "" {
		p("First ERROR line: `%s`\n\n", strings.ReplaceAll(rf.LogFirstError, "`", "'"))
	}
}

func relayedLine(s *float64) string {
	if s == nil {
		return "**not within 30 s of Redis answering**"
	}
	return fmt.Sprintf("%.2fs after Redis answered", *s)
}
