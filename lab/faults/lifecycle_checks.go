package faults

import (
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashsale/stock/internal/inventory"
)

// lifecycleLimit is the PER_USER_LIMIT of scenario 11.
const lifecycleLimit = 1

// checkLifecycle checks the rows at the end of a lifecycle run (every hold
// settled) against every answer of the load, and the audit of each SKU;
// readAt is when the rows were read, on the load's clock.
func (r *run) checkLifecycle(ops []lcOp, l *lcLoad, t *lcTables, audits map[string]lcAudit, readAt time.Duration) {
	lf := r.res.Lifecycle
	byID := map[string]lcRow{}
	for _, row := range t.orders {
		byID[row.ID] = row
	}
	if o := countFunc(ops, func(op lcOp) bool { return op.Answer == lcOther }); o > 0 {
		first := ops[slices.IndexFunc(ops, func(op lcOp) bool { return op.Answer == lcOther })]
		r.fail("%d answers were none of 200, 201, 404, 409, 503 (first: %s %s)", o, first.Kind, first.Err)
	}

	// Every 201 is an order row of that buyer, SKU and unit; no row
	// without an order whose answer was lost.
	created := map[string]bool{}
	unknownOrders := map[[2]string]int{}
	var lost, phantom, claims []string
	for _, op := range ops {
		switch {
		case op.Kind != lcOrder:
		case op.Status == http.StatusCreated:
			created[op.OrderID] = true
			row, ok := byID[op.OrderID]
			if !ok || row.User != op.User || row.SKU != op.SKU || row.Quantity != 1 {
				lost = append(lost, fmt.Sprintf("201 %s for %s of %s has no matching row", op.OrderID, op.User, op.SKU))
			} else if op.State != inventory.OrderHeld {
				claims = append(claims, fmt.Sprintf("order %s answered 201 %q, not held", op.OrderID, op.State))
			}
		case op.Answer == lcUnknown:
			unknownOrders[[2]string{op.SKU, op.User}]++
		}
	}
	unseen := 0
	for _, row := range t.orders {
		if created[row.ID] {
			continue
		}
		k := [2]string{row.SKU, row.User}
		if unknownOrders[k] == 0 {
			phantom = append(phantom, fmt.Sprintf("row %s of %s (%s) answers no order that may have made it", row.ID, row.User, row.State))
			continue
		}
		unknownOrders[k]--
		unseen++
	}
	r.res.Figures.LostOrders, r.res.Figures.PhantomOrders, r.res.Figures.UnseenOrders = len(lost), len(phantom), unseen
	if len(lost) > 0 {
		r.fail("%d orders answered 201 have no row: %s", len(lost), sample(lost))
	}
	if len(phantom) > 0 {
		r.fail("%d order rows were made by no request that may have made them: %s", len(phantom), sample(phantom))
	}

	// Units, by SKU: every unit of a cancelled or expired order came back
	// once (the stock row's available is the initial stock less what is
	// held or paid), and the audit says the same.
	units := map[string]map[string]int64{}
	perBuyer := map[[2]string]int64{}
	for _, row := range t.orders {
		if units[row.SKU] == nil {
			units[row.SKU] = map[string]int64{}
		}
		units[row.SKU][row.State] += row.Quantity
		switch row.State {
		case "held", "paid":
			perBuyer[[2]string{row.SKU, row.User}] += row.Quantity
		case "expired":
			lf.ExpiredOrders++
		case "cancelled":
			lf.CancelledOrders++
		}
		if row.State == "paid" && row.Settled >= row.Expires {
			r.fail("order %s was paid %.3fs after its hold lapsed (database clock)", row.ID, float64(row.Settled-row.Expires)/1e6)
		}
		if row.State == "final" {
			r.fail("order %s is final: placed without a hold under HOLD_TTL", row.ID)
		}
	}
	for _, sku := range slices.Sorted(maps.Keys(t.stock)) {
		s, u := t.stock[sku], units[sku]
		sale := s.Initial + s.Restocked
		returned := u["cancelled"] + u["expired"]
		lf.PaidUnits += u["paid"]
		lf.ReturnedUnits += returned
		lf.AvailableUnits += s.Available
		lf.InitialUnits += sale
		if over := u["paid"] + u["held"] - sale; over > 0 {
			r.res.Figures.OversoldUnits += over
			r.fail("%s: %d units paid or held of a sale of %d", sku, u["paid"]+u["held"], sale)
		}
		if s.Available+u["held"]+u["paid"] != sale {
			r.fail("%s: initial %d + restocked %d != available %d + held %d + paid %d: units of cancelled or expired orders "+
				"(%d) came back %+d times too many", sku, s.Initial, s.Restocked, s.Available, u["held"], u["paid"], returned,
				s.Available+u["held"]+u["paid"]-sale)
		}
		a, ok := audits[sku]
		if !ok {
			continue
		}
		r.res.Audits = append(r.res.Audits, Audit{SKU: sku, Initial: a.Initial + a.Restocked, Available: a.Available,
			Ordered: a.Held + a.Paid, Orders: int64(countFunc(t.orders, func(o lcRow) bool { return o.SKU == sku })), Consistent: a.Consistent})
		if !a.Consistent || a.Initial+a.Restocked != a.Available+a.Held+a.Paid {
			r.fail("%s: the audit is not consistent: %+v", sku, a)
		}
		if a.Available != s.Available || a.Held != u["held"] || a.Paid != u["paid"] || a.Returned != returned ||
			a.Expired != u["expired"] || a.Cancelled != u["cancelled"] {
			r.fail("%s: the audit %+v does not match the rows (available %d, held %d, paid %d, cancelled %d, expired %d)",
				sku, a, s.Available, u["held"], u["paid"], u["cancelled"], u["expired"])
		}
	}

	// No buyer above the limit, and each buyer's count is what it holds
	// or paid: given back once with every cancel or expiry.
	var above, counts []string
	for k, n := range perBuyer {
		if n > lifecycleLimit {
			above = append(above, fmt.Sprintf("%s holds or paid %d units of %s", k[1], n, k[0]))
		}
	}
	for k, n := range t.buyers {
		if n != perBuyer[k] {
			counts = append(counts, fmt.Sprintf("%s's count for %s is %d, its orders hold or paid %d", k[1], k[0], n, perBuyer[k]))
		}
	}
	for k, n := range perBuyer {
		if _, ok := t.buyers[k]; !ok && n > 0 {
			counts = append(counts, fmt.Sprintf("%s has no count for %s, its orders hold or paid %d", k[1], k[0], n))
		}
	}
	if t.unlimited {
		above, counts = nil, nil
	}
	if len(above) > 0 {
		r.fail("%d buyers above PER_USER_LIMIT=%d: %s", len(above), lifecycleLimit, sample(above))
	}
	if len(counts) > 0 {
		r.fail("%d buyers' counts (buyer_units) differ from their orders: %s", len(counts), sample(counts))
	}

	// Every answer to a pay, a cancel or a read true to the final row:
	// the states after held are final, so a state an answer named is the
	// row's for good.
	for _, op := range ops {
		if op.Kind == lcOrder || op.Answer != lcDefinite {
			continue
		}
		row, ok := byID[op.OrderID]
		said := lcSaid(op)
		switch {
		case !ok:
			claims = append(claims, fmt.Sprintf("%s of %s answered %d, and there is no such row", op.Kind, op.OrderID, op.Status))
		case said == "":
			claims = append(claims, fmt.Sprintf("%s of %s answered %d %s%s", op.Kind, op.OrderID, op.Status, op.Code, op.State))
		case said != "held" && said != row.State:
			claims = append(claims, fmt.Sprintf("%s of %s answered %d %s, the row ends %s", op.Kind, op.OrderID, op.Status, said, row.State))
		}
	}
	if len(claims) > 0 {
		r.fail("%d answers are not true to the rows: %s", len(claims), sample(claims))
	}

	// Each order's history, with the rows' final state as its last read.
	r.checkOrderHistories(ops, l, byID, readAt)
}

// lcSaid is the state a definite answer says the order is in ("" when
// the answer says none: a 404, or a code a pay or cancel must not get).
func lcSaid(op lcOp) string {
	switch op.Status {
	case http.StatusOK:
		return op.State
	case http.StatusConflict:
		switch op.Code {
		case "paid", "cancelled", "expired":
			return op.Code
		}
	}
	return ""
}

// checkOrderHistories runs the per-order check (lcModel) over every order
// answered 201 that has its row.
func (r *run) checkOrderHistories(ops []lcOp, l *lcLoad, byID map[string]lcRow, readAt time.Duration) {
	lf := r.res.Lifecycle
	byOrder := map[string][]porcupine.Operation{}
	for _, op := range ops {
		if op.Kind == lcOrder && op.Status == http.StatusCreated {
			if _, ok := byID[op.OrderID]; ok {
				byOrder[op.OrderID] = byOrder[op.OrderID][:0:0]
			}
		}
	}
	for _, op := range ops {
		if op.Kind == lcOrder {
			continue
		}
		row, ok := byID[op.OrderID]
		if _, placed := byOrder[op.OrderID]; !ok || !placed {
			continue
		}
		in := lcInput{Kind: op.Kind, Call: l.wall(op.Call), Ret: l.wall(op.Ret), Expires: row.Expires}
		switch op.Answer {
		case lcDefinite:
			said := lcSaid(op)
			if said == "" {
				continue // failed above
			}
			byOrder[op.OrderID] = append(byOrder[op.OrderID], lcOperation(op.Worker, in, lcOutput(said)))
		case lcUnknown:
			byOrder[op.OrderID] = append(byOrder[op.OrderID], lcOperation(op.Worker, in, ""))
		}
	}
	at := l.wall(readAt)
	var histories []lcOrderHistory
	for _, id := range slices.Sorted(maps.Keys(byOrder)) {
		row := byID[id]
		final := lcOperation(-1, lcInput{Kind: "final", Call: at, Ret: at, Expires: row.Expires}, lcOutput(row.State))
		histories = append(histories, lcOrderHistory{ID: id, Ops: append(byOrder[id], final)})
	}
	timeout := r.env.CheckTimeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	began := time.Now()
	v, err := checkOrders(histories, timeout, r.dir)
	lin := &r.res.Linearizability
	lin.Seconds, lin.Operations, lin.SKUs = seconds(time.Since(began)), v.Operations, 0
	lf.CheckedOrders, lf.CheckedOps, lf.IllegalOrders, lf.UnknownOrders = v.Orders, v.Operations, len(v.Illegal), v.Unknown
	switch {
	case err != nil:
		lin.Result = "not-run"
		r.fail("order histories: %v", err)
	case len(v.Illegal) > 0:
		lin.Result = "illegal"
		c := SKUCheck{SKU: "order " + v.Illegal[0], Result: "illegal", Reason: fmt.Sprintf("%d orders' histories are not linearizable", len(v.Illegal))}
		if v.Visualization != "" {
			c.Visualization, _ = filepath.Rel(r.env.Dir, v.Visualization)
		}
		lin.NotOK = append(lin.NotOK, c)
		r.fail("%d orders' histories are not linearizable (first: %s)%s", len(v.Illegal), v.Illegal[0], seeFile(c.Visualization))
	case v.Unknown > 0:
		lin.Result = "unknown"
		r.note("the checker ran out of time on %d orders", v.Unknown)
	default:
		lin.Result = "ok"
	}
	r.note("per-order check: %d orders, %d operations (the final rows included), in %.1fs", v.Orders, v.Operations, lin.Seconds)
}

// lcFigures are the figures of the requests called in [from, to).
func lcFigures(ops []lcOp, from, to time.Duration) Figures {
	var f Figures
	for _, op := range ops {
		if op.Call < from || op.Call >= to {
			continue
		}
		f.Requests++
		if op.Kind == lcOrder {
			f.Orders++
		}
		switch {
		case op.Status == http.StatusCreated:
			f.Created++
		case op.Status == http.StatusConflict && op.Kind == lcOrder:
			f.SoldOut++
		case op.Status == http.StatusServiceUnavailable && op.Answer == lcNoEffect:
			f.Busy++
		case op.Status == http.StatusServiceUnavailable:
			f.Unavailable++
		case op.Answer == lcNoEffect:
			f.Refused++
		case op.Answer == lcUnknown:
			f.NoAnswer++
		case op.Answer == lcOther:
			f.Other++
		}
		if op.Answer == lcUnknown {
			f.Unknown++
		}
	}
	f.Responses503 = f.Busy + f.Unavailable
	return f
}

// lifecycleAvailability checks that sales go on through and after the
// fault, and sums the run's requests. stoppedAt is when the sweeper was
// stopped, faultAt the fault, backAt the restart of what was killed,
// answersAt when it answered again.
func (r *run) lifecycleAvailability(ops []lcOp, fault string, stoppedAt, faultAt, backAt, answersAt, end time.Duration) {
	lf := r.res.Lifecycle
	lf.count(ops)
	if lf.LimitReached == 0 {
		r.warn("no order was refused limit_reached: the load did not test PER_USER_LIMIT")
	}
	if lf.PayExpired+lf.CancelExpired == 0 {
		r.warn("no pay or cancel was answered expired: the load did not race the expiry")
	}
	rate := func(from, to time.Duration) float64 {
		if to <= from {
			return 0
		}
		n := countFunc(ops, func(op lcOp) bool {
			return op.Kind == lcOrder && op.Status == http.StatusCreated && op.Call >= from && op.Call < to && !strings.HasPrefix(op.User, "burst")
		})
		return float64(n) / (to - from).Seconds()
	}
	lf.CreatedPerSecondBefore, lf.CreatedPerSecondAfter = rate(0, stoppedAt), rate(answersAt, end)
	var first *float64
	for _, op := range ops {
		if op.Kind == lcOrder && op.Status == http.StatusCreated && op.Call >= answersAt {
			s := seconds(op.Ret - answersAt)
			if first == nil || s < *first {
				first = &s
			}
		}
	}
	r.res.Figures.RecoverySeconds = first
	if first == nil || *first > 5 {
		r.warn("no order answered 201 within 5s of the fault's end")
	}
	if lf.CreatedPerSecondAfter < 0.3*lf.CreatedPerSecondBefore {
		r.warn("201s per second fell from %.1f before the fault to %.1f after it", lf.CreatedPerSecondBefore, lf.CreatedPerSecondAfter)
	}
	after := lcFigures(ops, answersAt+time.Second, end+time.Hour)
	if after.Requests > 0 && float64(after.Responses503+after.Unknown) > 0.05*float64(after.Requests) {
		r.warn("%d of the %d requests from a second after the fault's end were answered 503 or not at all", after.Responses503+after.Unknown, after.Requests)
	}
	switch fault {
	case LifecycleSweeperKill:
		// The two other instances sell on while one is dead.
		if down := lcFigures(ops, faultAt, backAt); down.Created == 0 {
			r.warn("no 201 while instance %d was dead", lf.CaughtIn)
		} else if float64(down.Responses503) > 0.05*float64(down.Requests) {
			r.warn("%d of the %d requests while instance %d was dead were answered 503", down.Responses503, down.Requests, lf.CaughtIn)
		}
	case LifecycleDatabaseCrash:
		// Nothing can be sold or settled while the database is down.
		if down := lcFigures(ops, faultAt+time.Second, backAt); down.Created > 0 {
			r.fail("%d orders called while the database was down were answered 201", down.Created)
		} else if down.Responses503 == 0 {
			r.warn("no 503 while the database was down")
		}
	}
}

// count adds the answers of ops to lf: orders, pays, cancels and reads by
// what they said, unknown outcomes, 503s and refused connections.
func (lf *LifecycleFigures) count(ops []lcOp) {
	for _, op := range ops {
		switch op.Kind {
		case lcOrder:
			lf.Orders++
			switch {
			case op.Status == http.StatusCreated:
				lf.Created++
			case op.Code == "sold_out":
				lf.SoldOut++
			case op.Code == "limit_reached":
				lf.LimitReached++
			}
		case lcPay:
			lf.Pays++
			switch lcSaid(op) {
			case "paid":
				lf.Paid++
			case "expired":
				lf.PayExpired++
			}
		case lcCancel:
			lf.Cancels++
			switch lcSaid(op) {
			case "cancelled":
				lf.Cancelled++
			case "expired":
				lf.CancelExpired++
			}
		case lcRead:
			lf.Reads++
		}
		if op.Answer == lcUnknown {
			lf.Unknown++
		}
		if op.Status == http.StatusServiceUnavailable {
			lf.Responses503++
		} else if op.Answer == lcNoEffect {
			lf.Refused++
		}
	}
}

// eventLog returns the function a scenario notes its events with: each at
// now() on the load's clock, in the result and the log, and returned.
func (r *run) eventLog(now func() time.Duration) func(format string, args ...any) time.Duration {
	return func(format string, args ...any) time.Duration {
		at := now()
		what := fmt.Sprintf(format, args...)
		r.res.Events = append(r.res.Events, Event{AtS: seconds(at), What: what})
		r.env.logf("  %6.2fs %s", seconds(at), what)
		return at
	}
}
