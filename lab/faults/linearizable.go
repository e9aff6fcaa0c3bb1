package faults

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/history"
)

// checkHistory checks each SKU's history with porcupine. Operations with
// no effect (503 busy, refused connections) are left out: the model lets
// them happen anywhere without changing the stock, so they cannot make a
// history illegal and only slow the search.
//
// An order whose outcome the client never learned may have taken effect at
// any time after its call, which can make the search outgrow its time when
// there are many (a long stall). For a SKU whose check ran out of time, the
// history is checked again with those outcomes resolved from the order
// rows, which the run has already checked against every answer: no row,
// no effect; a row, an effect before the end of the run.
func (r *run) checkHistory(orders []*order, all []history.Op, rows []orderRow, end time.Duration, initial map[string]int64) {
	var ops []history.Op
	for _, op := range all {
		if op.Outcome != history.NoEffect {
			ops = append(ops, op)
		}
	}
	timeout := r.env.CheckTimeout
	if timeout == 0 {
		timeout = 20 * time.Second
	}
	lin := &r.res.Linearizability
	lin.Operations = len(ops)
	began := time.Now()
	defer func() { lin.Seconds = seconds(time.Since(began)) }()
	verdicts, err := history.Check(ops, initial, timeout, r.dir)
	if err != nil {
		lin.Result = "not-run"
		r.fail("history check: %v", err)
		return
	}
	lin.SKUs, lin.Result = len(verdicts), "ok"
	for _, v := range verdicts {
		if v.Linearizable() {
			continue
		}
		c := SKUCheck{SKU: v.SKU, Result: strings.ToLower(string(v.Result)), Reason: v.Reason}
		if v.Visualization != "" {
			c.Visualization, _ = filepath.Rel(r.env.Dir, v.Visualization)
		}
		if c.Result == "unknown" {
			if ok, err := checkResolved(v.SKU, orders, rows, end, timeout, initial[v.SKU]); err == nil && ok {
				if v.Visualization != "" {
					_ = os.Remove(v.Visualization) // kept only for histories that fail
				}
				r.note("%s: the check ran out of time (%v) on the raw history; with the unknown outcomes resolved from the "+
					"order rows it is linearizable", v.SKU, timeout)
				continue
			}
		}
		lin.NotOK = append(lin.NotOK, c)
		if c.Result == "illegal" {
			lin.Result = "illegal"
			r.fail("%s: history not linearizable (%s)%s", v.SKU, v.Reason, seeFile(c.Visualization))
		} else if lin.Result == "ok" {
			lin.Result = "unknown"
			r.note("%s: the checker ran out of time (%v): linearizability not proven%s", v.SKU, timeout, seeFile(c.Visualization))
		}
	}
}

// checkResolved checks sku's history with every unknown outcome replaced by
// what the order rows say.
func checkResolved(sku string, orders []*order, rows []orderRow, end time.Duration, timeout time.Duration, initial int64) (bool, error) {
	hasRow := map[string]bool{}
	for _, row := range rows {
		hasRow[row.UserID] = true
	}
	var ops []history.Op
	for _, o := range orders {
		if o.sku != sku {
			continue
		}
		op := history.Op{Client: o.worker, SKU: sku, Quantity: o.quantity, Call: int64(o.call()), Return: int64(o.ret()), Outcome: o.outcome}
		switch o.outcome {
		case history.NoEffect:
			continue
		case history.Unknown:
			if !hasRow[o.userID] {
				continue
			}
			op.Outcome, op.Return = history.OK, int64(end)
		}
		ops = append(ops, op)
	}
	v, err := history.Check(ops, map[string]int64{sku: initial}, timeout, "")
	if err != nil || len(v) != 1 {
		return false, err
	}
	return v[0].Linearizable(), nil
}

func seeFile(path string) string {
	if path == "" {
		return ""
	}
	return ", see " + path
}
