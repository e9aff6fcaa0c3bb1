package faults

import (
	"strings"
	"testing"
	"time"
)

// TestCheckBatchesFindsPartialBatches: checkBatches passes the rows of
// whole batches and fails each way a transaction's rows can show that it
// was not one batch, or that a batch caught open left a row.
func TestCheckBatchesFindsPartialBatches(t *testing.T) {
	ms := time.Millisecond
	// o builds an order answered by instance with a 201 (or, with no
	// return, no answer: the instance was killed), called at call.
	o := func(user, sku string, instance int, call, ret time.Duration) *order {
		a := attempt{instance: instance, call: call, ret: ret, answer: ansCreated, orderID: "id-" + user}
		if ret == 0 {
			a.answer, a.ret = ansNoAnswer, 5*time.Second
		}
		return &order{sku: sku, quantity: 1, userID: user, attempts: []attempt{a}}
	}
	row := func(user, sku, tx string) orderRow {
		return orderRow{ID: "id-" + user, SKU: sku, Quantity: 1, UserID: user, Tx: tx}
	}
	// A whole run: two batches on instance 0 (one of them committed, its
	// answers lost at the kill), one order alone on instance 1, and one
	// request of instance 0 in flight without a row (its batch was open).
	orders := []*order{
		o("a", "s-a", 0, 1*ms, 10*ms), o("b", "s-a", 0, 2*ms, 10*ms),
		o("c", "s-b", 1, 3*ms, 8*ms),
		o("d", "s-a", 0, 20*ms, 0), o("e", "s-a", 0, 21*ms, 0),
		o("f", "s-a", 0, 22*ms, 0),
	}
	rows := []orderRow{row("a", "s-a", "1"), row("b", "s-a", "1"), row("c", "s-b", "2"), row("d", "s-a", "3"), row("e", "s-a", "3")}
	caught := []openTx{{ID: "4", Wrote: true, RowsModified: -1}}
	stopped, killed := 25*ms, 26*ms

	r := &run{}
	r.checkBatches(orders, rows, 0, stopped, killed, caught)
	if len(r.res.Failures) > 0 {
		t.Fatalf("whole batches failed: %q", r.res.Failures)
	}
	if f := r.res.Batches; f.Transactions != 3 || f.MultiOrder != 2 || f.VictimMultiOrder != 2 || f.InFlightWithRow != 2 || f.InFlightWithoutRow != 1 {
		t.Errorf("figures %+v", *f)
	}

	for _, c := range []struct {
		name   string
		change func(rows []orderRow, orders []*order, caught []openTx) []openTx
		want   string
	}{
		{"two instances in one transaction", func(rows []orderRow, orders []*order, c []openTx) []openTx {
			orders[1].attempts[0].instance = 2
			return c
		}, "sent to 2 instances"},
		{"answered before a batch-mate was sent", func(_ []orderRow, orders []*order, c []openTx) []openTx {
			orders[1].attempts[0].call = 11 * ms
			orders[1].attempts[0].ret = 30 * ms
			return c
		}, "before order of b"},
		{"a row of the transaction caught open", func(rows []orderRow, _ []*order, c []openTx) []openTx {
			rows[4].Tx = "4"
			return c
		}, "was open on the killed instance"},
		{"more orders written in the open transactions than unanswered without a row (MySQL)", func(_ []orderRow, _ []*order, _ []openTx) []openTx {
			// Two SKUs in the load: at most 4 of its rows are stock rows.
			return []openTx{{ID: "x", Wrote: true, RowsModified: 6}}
		}, "had written 2 orders"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rows := append([]orderRow(nil), rows...)
			var orders2 []*order
			for _, o := range orders {
				cp := *o
				cp.attempts = append([]attempt(nil), o.attempts...)
				orders2 = append(orders2, &cp)
			}
			caught := c.change(rows, orders2, append([]openTx(nil), caught...))
			r := &run{}
			r.checkBatches(orders2, rows, 0, stopped, killed, caught)
			if len(r.res.Failures) != 1 || !strings.Contains(r.res.Failures[0], c.want) {
				t.Errorf("failures %q, want one saying %q", r.res.Failures, c.want)
			}
		})
	}
}
