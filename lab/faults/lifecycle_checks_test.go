package faults

import (
	"net/http"
	"testing"
	"time"
)

// TestLifecycleRowChecks is the control of the row checks of scenario 11:
// a consistent end passes, and each way the rows can betray an answer or
// the books — a unit given back twice, a pay answered 200 whose row
// expired, a buyer above the limit, a 201 without its row, a buyer's count
// not given back — fails the run.
func TestLifecycleRowChecks(t *testing.T) {
	now := time.Now()
	exp := now.Add(2 * time.Second).UnixMicro()
	good := func() ([]lcOp, *lcTables, map[string]lcAudit) {
		ops := []lcOp{
			{Kind: lcOrder, SKU: "s", User: "u1", OrderID: "o1", Status: http.StatusCreated, State: "held", Answer: lcDefinite, Ret: time.Millisecond},
			{Kind: lcOrder, SKU: "s", User: "u2", OrderID: "o2", Status: http.StatusCreated, State: "held", Answer: lcDefinite, Ret: time.Millisecond},
			{Kind: lcPay, SKU: "s", User: "u1", OrderID: "o1", Status: http.StatusOK, State: "paid", Answer: lcDefinite,
				Call: 10 * time.Millisecond, Ret: 20 * time.Millisecond},
		}
		tables := &lcTables{
			orders: []lcRow{
				{ID: "o1", SKU: "s", User: "u1", State: "paid", Quantity: 1, Expires: exp, Settled: exp - 1_000_000},
				{ID: "o2", SKU: "s", User: "u2", State: "expired", Quantity: 1, Expires: exp, Settled: exp + 500_000},
			},
			stock:  map[string]lcStock{"s": {Initial: 3, Available: 2}},
			buyers: map[[2]string]int64{{"s", "u1"}: 1, {"s", "u2"}: 0},
		}
		audits := map[string]lcAudit{"s": {SKU: "s", Initial: 3, Available: 2, Paid: 1, Returned: 1, Expired: 1, Consistent: true}}
		return ops, tables, audits
	}
	check := func(ops []lcOp, tables *lcTables, audits map[string]lcAudit) []string {
		r := &run{env: &Env{CheckTimeout: 5 * time.Second}, res: Result{Lifecycle: &LifecycleFigures{}}}
		l := &lcLoad{wallStart: now}
		r.checkLifecycle(ops, l, tables, audits, 5*time.Second)
		return r.res.Failures
	}
	if f := check(good()); len(f) > 0 {
		t.Fatalf("a consistent end fails: %q", f)
	}
	cases := map[string]func(ops []lcOp, tables *lcTables, audits map[string]lcAudit) []lcOp{
		"a unit given back twice": func(ops []lcOp, tables *lcTables, _ map[string]lcAudit) []lcOp {
			tables.stock["s"] = lcStock{Initial: 3, Available: 3}
			return ops
		},
		"a pay answered 200 whose row expired": func(ops []lcOp, tables *lcTables, _ map[string]lcAudit) []lcOp {
			tables.orders[0].State = "expired"
			tables.stock["s"] = lcStock{Initial: 3, Available: 3}
			tables.buyers[[2]string{"s", "u1"}] = 0
			return ops
		},
		"a buyer above the limit": func(ops []lcOp, tables *lcTables, _ map[string]lcAudit) []lcOp {
			tables.orders[1].User, tables.orders[1].State = "u1", "held"
			tables.stock["s"] = lcStock{Initial: 3, Available: 1}
			tables.buyers[[2]string{"s", "u1"}] = 2
			return append(ops, lcOp{Kind: lcOrder, SKU: "s", User: "u1", Answer: lcUnknown})
		},
		"a 201 without its row": func(ops []lcOp, tables *lcTables, _ map[string]lcAudit) []lcOp {
			tables.orders = tables.orders[:1]
			tables.stock["s"] = lcStock{Initial: 3, Available: 2}
			return ops
		},
		"a buyer's count not given back": func(ops []lcOp, tables *lcTables, _ map[string]lcAudit) []lcOp {
			tables.buyers[[2]string{"s", "u2"}] = 1
			return ops
		},
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			ops, tables, audits := good()
			ops = spoil(ops, tables, audits)
			if f := check(ops, tables, audits); len(f) == 0 {
				t.Error("the checks found nothing")
			} else {
				t.Logf("caught: %q", f)
			}
		})
	}
}
