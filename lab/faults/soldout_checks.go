package faults

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashsale/stock/lab/history"
)

// soHistories splits the load's operations on the stock by SKU: orders
// (201, 409 sold_out, unknown), cancels answered cancelled or of unknown
// outcome, restocks. Other answers leave the stock as it was.
func soHistories(ops []lcOp, restocks []soRestock) map[string][]soOp {
	by := map[string][]soOp{}
	for _, op := range ops {
		so := soOp{Units: 1, Call: op.Call, Ret: op.Ret, Client: op.Worker}
		switch {
		case op.Kind == lcOrder && op.Status == http.StatusCreated:
			so.Kind, so.Outcome = soTake, history.OK
		case op.Kind == lcOrder && op.Status == http.StatusConflict && op.Code == "sold_out":
			so.Kind, so.Outcome = soTake, history.SoldOut
		case op.Kind == lcOrder && op.Answer == lcUnknown:
			so.Kind, so.Outcome = soTake, history.Unknown
		case op.Kind == lcCancel && op.Status == http.StatusOK && op.State == "cancelled":
			so.Kind, so.Outcome = soGive, history.OK
		case op.Kind == lcCancel && op.Answer == lcUnknown:
			so.Kind, so.Outcome = soGive, history.Unknown
		default:
			continue
		}
		by[op.SKU] = append(by[op.SKU], so)
	}
	for _, rs := range restocks {
		by[rs.SKU] = append(by[rs.SKU], soOp{Kind: soGive, Units: rs.Units, Call: rs.Call, Ret: rs.Ret, Outcome: rs.Outcome, Client: -1 - rs.Instance})
	}
	return by
}

// checkSoldOutHistories checks each SKU's history against its stock, each
// sold-out answer allowed to rest on a state up to the bound (and the
// clocks' slack) before its call, and merges the verdict into the run's
// linearizability (which holds the per-order check). It returns the SKUs
// found illegal.
func (r *run) checkSoldOutHistories(ops []lcOp, restocks []soRestock, skus []string) int {
	timeout := r.env.CheckTimeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	by := soHistories(ops, restocks)
	lin := &r.res.Linearizability
	began := time.Now()
	var illegal, unknown []string
	n := 0
	for _, sku := range skus {
		n += len(by[sku])
		visualize := ""
		if len(illegal) < 3 {
			visualize = filepath.Join(r.dir, "soldout-"+sku+".html")
		}
		result, err := checkSoldOutHistory(by[sku], r.initial[sku], soldOutBound+soldOutClockSlack, timeout, visualize)
		if err != nil {
			r.fail("%s: sold-out history check: %v", sku, err)
			continue
		}
		c := SKUCheck{SKU: sku, Result: strings.ToLower(string(result))}
		if visualize != "" && result != porcupine.Ok {
			c.Visualization, _ = filepath.Rel(r.env.Dir, visualize)
		}
		switch result {
		case porcupine.Illegal:
			illegal = append(illegal, sku)
			c.Reason = fmt.Sprintf("a sold-out answer that no state within %s of its call explains, or a sale the stock does not cover", soldOutBound+soldOutClockSlack)
			lin.NotOK = append(lin.NotOK, c)
		case porcupine.Unknown:
			unknown = append(unknown, sku)
			lin.NotOK = append(lin.NotOK, c)
		}
	}
	lin.SKUs, lin.Operations, lin.Seconds = len(skus), lin.Operations+n, lin.Seconds+seconds(time.Since(began))
	switch {
	case len(illegal) > 0:
		lin.Result = "illegal"
		r.fail("%d of %d SKUs' stock histories are not linearizable with sold-out answers %s early (first: %s)%s", len(illegal), len(skus),
			soldOutBound+soldOutClockSlack, illegal[0], seeFile(lin.NotOK[slices.IndexFunc(lin.NotOK, func(c SKUCheck) bool { return c.SKU == illegal[0] })].Visualization))
	case len(unknown) > 0 && lin.Result == "ok":
		lin.Result = "unknown"
		r.note("the stock-history check ran out of time (%s) on %d SKUs: %s", timeout, len(unknown), sample(unknown))
	}
	r.note("stock-history check (sold-out answers moved %s early): %d SKUs, %d operations, %d illegal, %d unknown, in %.1fs",
		soldOutBound+soldOutClockSlack, len(skus), n, len(illegal), len(unknown), seconds(time.Since(began)))
	return len(illegal)
}

// soldOutAvailability sums the run's requests, the returns and what
// became of them, and checks that sales went on: through the freeze on
// the two other instances, and after it; 503s few.
func (r *run) soldOutAvailability(ops []lcOp, l *soLoad, fz *soFreeze, end time.Duration) {
	lf := r.res.Lifecycle
	lf.count(ops)
	l.mu.Lock()
	cycles, restocks := slices.Clone(l.cycles), slices.Clone(l.restocks)
	l.mu.Unlock()
	restocked := countFunc(restocks, func(rs soRestock) bool { return rs.Outcome == history.OK })
	// The units sold again, apart those whose wait spans the freeze (an
	// order sent to the instance as it was frozen waits for SIGCONT).
	var sold []float64
	spanning := 0
	for _, cy := range cycles {
		switch {
		case !cy.Sold:
		case cy.SoldRet > fz.frozenAt && cy.GiveRet < fz.resumedAt:
			spanning++
		default:
			sold = append(sold, max(0, seconds(cy.SoldRet-cy.GiveRet)))
		}
	}
	slices.Sort(sold)
	r.note("returns: %d cancels answered cancelled (each through another instance than the one that placed it), %d restocks answered 200 (%d not)",
		lf.Cancelled, restocked, len(restocks)-restocked)
	if len(sold) > 0 {
		r.note("%d of %d units given back by the buyer groups were sold again to an instance that had not seen the return; "+
			"from the return's answer to the 201, median %.2fs, slowest %.2fs (bound %s, orders every 0.10-0.15s), "+
			"leaving out the %d whose wait spanned the freeze",
			len(sold)+spanning, len(cycles), sold[len(sold)/2], sold[len(sold)-1], soldOutBound, spanning)
	} else {
		r.warn("no unit given back was sold again within %s", soProbeFor)
	}
	r.note("freeze: instance %d frozen %.2fs; %d units of the %d SKUs of one unit it had marked sold out were given back meanwhile, and its first orders after SIGCONT sold %d",
		fz.victim, seconds(fz.resumedAt-fz.frozenAt), fz.returned, fz.skus, fz.soldAfter)
	if len(fz.skipped) > 0 {
		r.note("%d SKUs of the freeze were left out: %s", len(fz.skipped), sample(fz.skipped))
	}
	if len(fz.refusedAfter) > 0 {
		r.note("after SIGCONT the frozen instance did not sell: %s", sample(fz.refusedAfter))
	}

	frozen := lcFigures(slices.DeleteFunc(slices.Clone(ops), func(op lcOp) bool { return op.Instance == fz.victim }), fz.frozenAt, fz.resumedAt)
	if frozen.Created == 0 {
		r.warn("no 201 from the two other instances while instance %d was frozen", fz.victim)
	}
	for _, ph := range []struct {
		name     string
		from, to time.Duration
	}{{"before the freeze", 0, fz.frozenAt}, {"after SIGCONT", fz.resumedAt, end + time.Hour}} {
		f := lcFigures(ops, ph.from, ph.to)
		if f.Created == 0 {
			r.warn("no 201 %s", ph.name)
		}
		if f.Requests > 0 && float64(f.Responses503+f.Unknown) > 0.05*float64(f.Requests) {
			r.warn("%d of the %d requests %s were answered 503 or not at all", f.Responses503+f.Unknown, f.Requests, ph.name)
		}
	}
	if lf.LimitReached > 0 {
		r.warn("%d orders were refused limit_reached: every order is a buyer of its own", lf.LimitReached)
	}
	perSKU := map[string]int{}
	for _, cy := range cycles {
		perSKU[cy.SKU]++
	}
	if len(perSKU) > 0 {
		counts := slices.Sorted(maps.Values(perSKU))
		r.note("%d returns by the buyer groups of %d SKUs (%d to %d per SKU)", len(cycles), len(perSKU), counts[0], counts[len(counts)-1])
	}
}

// settledRows reads the run's rows until two reads in a row agree, at most
// for timeout, and returns the last and how many times they changed. The
// load has ended, but a request whose client gave up (an unknown outcome)
// may still be in the service, and commit between the reads of the orders
// and of the stock (three statements, not one snapshot).
func settledRows(ctx context.Context, dbURL string, timeout time.Duration) (*lcTables, int, error) {
	last, err := readLifecycle(ctx, dbURL)
	if err != nil {
		return nil, 0, err
	}
	changes := 0
	settled := waitUntil(ctx, timeout, func() bool {
		var next *lcTables
		if next, err = readLifecycle(ctx, dbURL); err != nil {
			return true
		}
		same := sameTables(last, next)
		if !same {
			changes++
		}
		last = next
		return same
	})
	switch {
	case err != nil:
		return nil, changes, err
	case !settled:
		return nil, changes, fmt.Errorf("the rows still changed %s after the load ended", timeout)
	}
	return last, changes, nil
}

// sameTables reports whether two reads of the rows hold the same orders,
// in the same states, the same stock and the same buyers' counts.
func sameTables(a, b *lcTables) bool {
	if len(a.orders) != len(b.orders) || !maps.Equal(a.stock, b.stock) || !maps.Equal(a.buyers, b.buyers) {
		return false
	}
	states := make(map[string]string, len(a.orders))
	for _, o := range a.orders {
		states[o.ID] = o.State
	}
	for _, o := range b.orders {
		if s, ok := states[o.ID]; !ok || s != o.State {
			return false
		}
	}
	return true
}
