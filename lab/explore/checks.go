package explore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/history"
)

// The rules every finished schedule is held to.

// check holds one finished schedule of one SKU to the rules.
func (x *Explorer) check(ctx context.Context, sc Scenario, sku string, st *store, answers []answer, returned []int64, s *scheduler) (inventory.Audit, []string) {
	skuOf := make([]string, len(answers))
	for i := range skuOf {
		skuOf[i] = sku
	}
	audits, problems := x.checkAll(ctx, sc, []string{sku}, []int64{sc.Stock}, skuOf, st, answers, returned, s)
	return audits[sku], problems
}

// checkSKUs holds one finished schedule of several SKUs to the rules.
func (x *Explorer) checkSKUs(ctx context.Context, sc Scenario, skus []string, stocks []int64, skuOf []string, st *store, answers []answer, returned []int64, s *scheduler) []string {
	_, problems := x.checkAll(ctx, sc, skus, stocks, skuOf, st, answers, returned, s)
	return problems
}

// checkAll holds one finished schedule to the rules: every SKU's audit
// adds up, every answer is true to the rows and explained by the
// schedule's faults, and each SKU's history is linearizable.
func (x *Explorer) checkAll(ctx context.Context, sc Scenario, skus []string, stocks []int64, skuOf []string, st *store, answers []answer, returned []int64, s *scheduler) (map[string]inventory.Audit, []string) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	audits := map[string]inventory.Audit{}
	initial := map[string]int64{}
	for j, sku := range skus {
		a, err := x.store.Audit(ctx, sku)
		if err != nil {
			return audits, []string{fmt.Sprintf("audit of %s: %v", sku, err)}
		}
		if !a.Consistent() {
			add("audit of %s broken: initial %d, available %d, ordered %d", sku, a.Initial, a.Available, a.Ordered)
		}
		audits[sku], initial[sku] = a, stocks[j]
	}
	ops := make([]history.Op, len(answers))
	for i, ans := range answers {
		name := string(rune('A' + i))
		a := audits[skuOf[i]]
		outcome := history.OutcomeOf(ans.err)
		ops[i] = history.Op{Client: i, SKU: skuOf[i], Quantity: sc.Quantities[i], Call: 0, Return: returned[i], Outcome: outcome}
		switch outcome {
		case history.OK:
			if o, found, err := x.store.FindOrder(ctx, ans.order.ID); err != nil || !found || o.Quantity != sc.Quantities[i] || o.SKU != skuOf[i] {
				add("%s was answered 201 but its order %s of %s is not there (%v)", name, ans.order.ID, skuOf[i], err)
			}
		case history.SoldOut, history.NoEffect:
			for _, id := range st.inserted[i] {
				if _, found, err := x.store.FindOrder(ctx, id); err != nil || found {
					add("%s was refused (%v) but its order %s exists (%v)", name, ans.err, id, err)
				}
			}
		}
		// 201 and 409 are the only answers a buyer that no fault struck
		// may get. A buyer whose lock expired under it may be told busy
		// (fenced off), one whose commit answer was lost unavailable (or
		// busy, when it learned that nothing was committed), and so may
		// every buyer of a batch whose commit answer was lost; nobody may
		// get an unclassified error (a 500).
		switch answer := inventory.Outcome(ans.err); {
		case outcome == history.OK || outcome == history.SoldOut:
		case errors.Is(ans.err, inventory.ErrLimitReached) && sc.PerUserLimit > 0:
			// True only if the user's units (every order of the sale
			// is the user's) leave no room for this one.
			if a.Ordered+sc.Quantities[i] <= sc.PerUserLimit {
				add("%s was refused limit_reached, yet the user holds %d units under a limit of %d", name, a.Ordered, sc.PerUserLimit)
			}
		case answer == "busy" && (s.expired[i] || s.lostAnswer[i]):
		case answer == "unavailable" && (s.lostAnswer[i] || errors.Is(ans.err, errLostAnswer)):
		default:
			add("%s was answered %q, which no fault of the schedule explains (lock expired: %v, commit answer lost: %v): %v",
				name, answer, s.expired[i], s.lostAnswer[i], ans.err)
		}
	}
	if sc.Retry {
		ops = x.checkRetry(ctx, skus[0], audits[skus[0]], answers, ops, add)
	}
	if a := audits[skus[0]]; sc.PerUserLimit > 0 && a.Ordered > sc.PerUserLimit {
		add("the user was sold %d units under a per-user limit of %d", a.Ordered, sc.PerUserLimit)
	}
	verdicts, err := history.Check(ops, initial, 10*time.Second, "")
	if err != nil {
		add("linearizability check: %v", err)
	}
	for _, v := range verdicts {
		if !v.Linearizable() {
			add("history not linearizable: %s", v)
		}
	}
	return audits, problems
}

// checkReserved holds a strategy that counts stock in a reservation store
// to its own audit once the writer has moved every accepted order: it adds
// up, nothing is pending, and it agrees with the database's.
func (x *Explorer) checkReserved(ctx context.Context, svc *sales.Service, sku string, w *writer) []string {
	var problems []string
	if w.err != nil {
		problems = append(problems, w.err.Error())
	}
	a, err := svc.Audit(ctx, sku)
	if err != nil {
		return append(problems, fmt.Sprintf("the strategy's audit: %v", err))
	}
	written, err := x.store.Audit(ctx, sku)
	if err != nil {
		return append(problems, fmt.Sprintf("audit: %v", err))
	}
	if !a.Consistent() || a.Pending != 0 || a.Orders != written.Orders || a.Ordered != written.Ordered || a.Available != written.Available {
		problems = append(problems, fmt.Sprintf("after every order was written, the reservation store's audit %+v and the database's %+v disagree", a, written))
	}
	return problems
}

// checkRetry holds the answers to one request sent several times under one
// idempotency key to its rules — at most one order, every 201 names it, and
// no attempt is told "sold out" or "busy" when the key's order exists: the
// client would take the last answer it saw for the truth — and returns the
// history of the one request they make: accepted when any attempt was,
// taking effect by the first 201.
func (x *Explorer) checkRetry(ctx context.Context, sku string, a inventory.Audit, answers []answer, ops []history.Op, add func(string, ...any)) []history.Op {
	if a.Orders > 1 {
		add("one idempotency key made %d orders", a.Orders)
	}
	var created string
	one := history.Op{Client: 0, SKU: sku, Quantity: ops[0].Quantity, Outcome: history.NoEffect}
	for i, ans := range answers {
		op := ops[i]
		switch {
		case op.Outcome == history.OK && created == "":
			created, one.Outcome, one.Return = ans.order.ID, history.OK, op.Return
		case op.Outcome == history.OK && ans.order.ID != created:
			add("two 201s for one key name different orders: %s and %s", created, ans.order.ID)
		case op.Outcome == history.OK:
			one.Return = min(one.Return, op.Return)
		}
	}
	if a.Orders > 0 {
		for i, ans := range answers {
			if o := ops[i].Outcome; o == history.SoldOut || o == history.NoEffect {
				add("%s was told %q, but its key's order exists", string(rune('A'+i)), inventory.Outcome(ans.err))
			}
		}
	}
	if one.Outcome != history.OK {
		for _, op := range ops {
			one.Return = max(one.Return, op.Return)
			if op.Outcome == history.Unknown || (op.Outcome == history.SoldOut && one.Outcome == history.NoEffect) {
				one.Outcome = op.Outcome
			}
		}
	}
	return []history.Op{one}
}
