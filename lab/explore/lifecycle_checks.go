package explore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/history"
)

// writeAll writes the n orders placed into the reservation store before a
// schedule into the database, outside the schedule.
func writeAll(ctx context.Context, write func(context.Context, string) (int, error), sku string, n int) error {
	for written := 0; written < n; {
		m, err := write(ctx, sku)
		if err != nil {
			return fmt.Errorf("explore: write the holds: %w", err)
		}
		if m == 0 {
			return fmt.Errorf("explore: %d of %d holds written, and the writer finds no more", written, n)
		}
		written += m
	}
	return nil
}

// sweepLeftovers expires, outside any schedule, the holds a schedule left
// lapsed but held: the next schedule's sweepers would take them (a sweep
// takes every SKU's).
func sweepLeftovers(ctx context.Context, svc *sales.Service) error {
	if _, err := svc.ExpireHolds(ctx, 0); err != nil {
		return fmt.Errorf("explore: expire the holds the schedule left lapsed: %w", err)
	}
	return nil
}

// checkBuyerCounts holds each buyer's count of the per-user limit
// (buyer_units) to its orders' rows: the units of its held and paid orders,
// no more (a claim left behind by an order that was not taken, as once
// happened in batched) and no fewer (a return given back twice).
func (x *Explorer) checkBuyerCounts(ctx context.Context, lc Lifecycle, sku string, st *store, holds, rows []inventory.Order, answers []lifecycleAnswer) []string {
	batches, ok := x.store.(batched.Store)
	if !ok {
		return nil
	}
	st.mu.Lock()
	tried := maps.Clone(st.byUser)
	st.mu.Unlock()
	want := map[string]int64{}
	owes := func(o inventory.Order) {
		if _, ok := want[o.UserID]; !ok {
			want[o.UserID] = 0
		}
		if o.State == inventory.OrderHeld || o.State == inventory.OrderPaid {
			want[o.UserID] += o.Quantity
		}
	}
	for i, h := range holds {
		row := rows[i]
		row.UserID = h.UserID
		if !slices.Contains(tried[h.UserID], row.ID) {
			owes(row) // placed before the schedule, not through its store
		} else {
			owes(inventory.Order{UserID: h.UserID})
		}
	}
	for i, act := range lc.Actors {
		if act.Act != Buy {
			continue
		}
		user := act.User
		if user == "" {
			user = "buyer-" + string(rune('A'+i))
		}
		owes(inventory.Order{UserID: user})
	}
	// Every order tried for a buyer, whichever transaction inserted it:
	// one whose commit answer was lost may be there, though its buyer was
	// answered 503.
	for user := range want {
		seen := map[string]bool{}
		for _, id := range tried[user] {
			if seen[id] {
				continue
			}
			seen[id] = true
			if o, found, err := x.store.FindOrder(ctx, id); err == nil && found {
				owes(o)
			}
		}
	}
	users := make([]string, 0, len(want))
	for u := range want {
		users = append(users, u)
	}
	slices.Sort(users)
	var counts map[string]int64
	err := batches.InBatchTx(ctx, func(ctx context.Context, tx batched.Tx) error {
		var err error
		counts, err = tx.LockBuyers(ctx, sku, users)
		return err
	})
	if err != nil {
		return []string{fmt.Sprintf("read the buyers' counts: %v", err)}
	}
	var problems []string
	for _, u := range users {
		if counts[u] != want[u] {
			problems = append(problems, fmt.Sprintf("buyer %s is counted %d units of the limit, but holds or paid for %d by the rows", u, counts[u], want[u]))
		}
	}
	return problems
}

// markedCall is the call, in the history's doubled positions, of actor i's
// second attempt, refused sold out, as the sold-out mark lets it be: a
// mark stands for the refusal that set it, so the refusal it answers may
// be as old as the oldest refusal on the same instance that was answered
// before the attempt was sent, and sent after the bound's step when that
// step came before the attempt (the clock then moved past every older
// mark). A refusal no mark explains keeps its own call, and the history
// then shows a unit refused that was there.
func markedCall(lc Lifecycle, answers []lifecycleAnswer, returned []int64, i int, boundAt int64) int64 {
	call := 2*answers[i].firstAt + 1
	bound := int64(-1)
	if boundAt >= 0 && 2*boundAt < call {
		bound = 2 * boundAt
	}
	type attempt struct{ sent, answered int64 }
	earliest := call
	for j, act := range lc.Actors {
		if act.Act != Buy || act.Instance != lc.Actors[i].Instance {
			continue
		}
		a := answers[j]
		var refused []attempt
		switch {
		case a.first != nil:
			refused = append(refused, attempt{0, 2 * a.firstAt})
			if j != i && errors.Is(a.err, inventory.ErrSoldOut) {
				refused = append(refused, attempt{2*a.firstAt + 1, 2 * returned[j]})
			}
		case errors.Is(a.err, inventory.ErrSoldOut):
			refused = append(refused, attempt{0, 2 * returned[j]})
		}
		for _, r := range refused {
			if r.answered < call && r.sent >= bound {
				earliest = min(earliest, r.sent)
			}
		}
	}
	return earliest
}

// checkLifecycle holds one finished schedule of the lifecycle to the
// rules: the audit adds up (no unit returned twice, none lost, none
// oversold); the units the committed transactions gave back are the units
// of the orders that came back; every answer that names an order's state
// names the state its row has (a state other than held never changes);
// busy and unavailable only where a fault struck the actor; the sweepers
// expired no more orders than there are expired, and exactly as many when
// nothing else expires them; and the buyers' history is linearizable
// against a stock counter that the returns add to.
func (x *Explorer) checkLifecycle(ctx context.Context, lc Lifecycle, sku string, st *store, holds []inventory.Order,
	answers []lifecycleAnswer, returned []int64, boundAt int64, s *scheduler,
) (inventory.Audit, []string) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	a, err := x.store.Audit(ctx, sku)
	if err != nil {
		return a, []string{fmt.Sprintf("audit: %v", err)}
	}
	if !a.Consistent() {
		add("audit broken: initial %d, available %d, held or paid %d, returned %d (%d cancelled, %d expired orders)",
			a.Initial, a.Available, a.Ordered, a.Returned, a.Cancelled, a.Expired)
	}
	var back int64
	for _, units := range st.returned {
		back += units
	}
	if back != a.Returned {
		add("committed transactions gave back %d units, but the cancelled and expired orders hold %d", back, a.Returned)
	}
	rows := make([]inventory.Order, len(holds))
	for i, h := range holds {
		o, found, err := x.store.FindOrder(ctx, h.ID)
		if err != nil || !found {
			add("hold %d's order %s is not there (%v)", i+1, h.ID, err)
			continue
		}
		rows[i] = o
	}

	initial := lc.Stock
	for _, h := range lc.Holds {
		initial -= h.Quantity
	}
	var ops []history.Op
	swept, sweptKnown, onlySweepers := 0, true, true
	for i, act := range lc.Actors {
		name, ans := string(rune('A'+i)), answers[i]
		onlySweepers = onlySweepers && act.Act == Sweep
		// The units an actor gave back are an operation of its own in
		// the history: taking a negative quantity, which the counter
		// always allows (history's model takes q whenever q <= what is
		// left), is a return. The harness saw them commit: by the
		// actor's answer, or, when its commit answer was lost, by the
		// end of the schedule (its late commit may land after its
		// answer).
		if units := st.returned[i]; units > 0 {
			op := history.Op{Client: i, SKU: sku, Quantity: -units, Return: 2 * returned[i], Outcome: history.OK}
			if s.lostAnswer[i] {
				op.Return = 2 * int64(len(s.trace)+1)
			}
			ops = append(ops, op)
		}
		if said := ans.said(act.Act); said != "" {
			row := rows[act.Hold]
			want := map[Act]string{Pay: inventory.OrderPaid, Cancel: inventory.OrderCancelled}[act.Act]
			switch {
			case ans.err == nil && want != "" && said != want:
				add("%s %s hold %d and was answered with the order %s", name, act.Act, act.Hold+1, said)
			case said != inventory.OrderHeld && said != row.State:
				add("%s %s hold %d and was answered %s, but the order is %s", name, act.Act, act.Hold+1, said, row.State)
			}
			continue
		}
		if act.Act == Buy {
			outcome := history.OutcomeOf(ans.err)
			op := history.Op{Client: i, SKU: sku, Quantity: act.Quantity, Return: 2 * returned[i], Outcome: outcome}
			if ans.first != nil {
				// Two attempts: the first refused, the second sent after
				// that answer (positions are doubled, so that one lies
				// between two of the trace's).
				ops = append(ops, history.Op{Client: i, SKU: sku, Quantity: act.Quantity, Return: 2 * ans.firstAt, Outcome: history.SoldOut})
				op.Call = 2*ans.firstAt + 1
				if outcome == history.SoldOut {
					op.Call = markedCall(lc, answers, returned, i, boundAt)
				}
			}
			ops = append(ops, op)
			switch outcome {
			case history.OK:
				if o, found, err := x.store.FindOrder(ctx, ans.order.ID); err != nil || !found || o.Quantity != act.Quantity {
					add("%s was answered 201 but its order %s is not there (%v)", name, ans.order.ID, err)
				}
				continue
			case history.SoldOut, history.NoEffect:
				for _, id := range st.inserted[i] {
					if _, found, err := x.store.FindOrder(ctx, id); err != nil || found {
						add("%s was refused (%v) but its order %s exists (%v)", name, ans.err, id, err)
					}
				}
			}
			if outcome == history.SoldOut {
				continue
			}
			if errors.Is(ans.err, inventory.ErrLimitReached) {
				if lc.PerUserLimit == 0 {
					add("%s was refused for a per-user limit, with none set: %v", name, ans.err)
				}
				continue
			}
		}
		if act.Act == Sweep {
			swept += ans.swept
			if ans.err == nil {
				continue
			}
			sweptKnown = false
		}
		// What is left is an answer that says nothing of the order:
		// busy, when the actor's lock expired under it or its commit
		// answer was lost; unavailable, when its commit answer was lost.
		switch answer := inventory.Outcome(ans.err); {
		case answer == "busy" && (s.expired[i] || s.lostAnswer[i]):
		case answer == "unavailable" && (s.lostAnswer[i] || errors.Is(ans.err, errLostAnswer)):
		default:
			add("%s %s and was answered %q, which no fault of the schedule explains (lock expired: %v, commit answer lost: %v): %v",
				name, act.Act, answer, s.expired[i], s.lostAnswer[i], ans.err)
		}
	}
	if lc.PerUserLimit > 0 {
		// What each buyer holds or paid for, by the rows: never past the
		// limit, however its orders on several instances interleaved.
		taken := map[string]int64{}
		for i, act := range lc.Actors {
			if act.Act == Buy && answers[i].err == nil {
				taken[answers[i].order.UserID] += act.Quantity
			}
		}
		for user, units := range taken {
			if units > lc.PerUserLimit {
				add("buyer %s was sold %d units under a per-user limit of %d", user, units, lc.PerUserLimit)
			}
		}
		if lc.Reserved == "" {
			// The reservation strategies count buyers in their store.
			problems = append(problems, x.checkBuyerCounts(ctx, lc, sku, st, holds, rows, answers)...)
		}
	}
	switch {
	case int64(swept) > a.Expired:
		add("the sweepers expired %d orders, but %d are expired", swept, a.Expired)
	case onlySweepers && sweptKnown && int64(swept) != a.Expired:
		add("the sweepers expired %d orders and nobody else expires any, but %d are expired", swept, a.Expired)
	}
	verdicts, err := history.Check(ops, map[string]int64{sku: initial}, 10*time.Second, "")
	if err != nil {
		add("linearizability check: %v", err)
	}
	for _, v := range verdicts {
		if !v.Linearizable() {
			add("history not linearizable: %s", v)
		}
	}
	return a, problems
}
