package faults

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashsale/stock/lab/history"
)

const ms = time.Millisecond

func takeOp(call, ret time.Duration, out history.Outcome) soOp {
	return soOp{Kind: soTake, Units: 1, Call: call, Ret: ret, Outcome: out}
}

func giveOp(call, ret time.Duration, out history.Outcome) soOp {
	return soOp{Kind: soGive, Units: 1, Call: call, Ret: ret, Outcome: out, Client: 1}
}

func checkSO(t *testing.T, initial int64, bound time.Duration, ops ...soOp) porcupine.CheckResult {
	t.Helper()
	result, err := checkSoldOutHistory(ops, initial, bound, 5*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	return result
}

// A refusal whose only explanation is a state older than the bound (the
// unit was back 1.4s before it, the bound is 1s) is illegal; with a bound
// that reaches back to the sold-out state it is legal.
func TestSoldOutModelRefusesAStateOlderThanTheBound(t *testing.T) {
	ops := []soOp{
		takeOp(0, 10*ms, history.OK),              // the only unit
		giveOp(100*ms, 110*ms, history.OK),        // back
		takeOp(1500*ms, 1510*ms, history.SoldOut), // refused 1.39s later
	}
	if got := checkSO(t, 1, time.Second, ops...); got != porcupine.Illegal {
		t.Errorf("a refusal 1.39s after the unit came back, bound 1s: %s, want illegal", got)
	}
	if got := checkSO(t, 1, 1500*ms, ops...); got != porcupine.Ok {
		t.Errorf("the same with a bound of 1.5s (it reaches the sold-out state): %s, want ok", got)
	}
}

// A refusal within the bound of the last sold-out state is legal.
func TestSoldOutModelAllowsARefusalWithinTheBound(t *testing.T) {
	got := checkSO(t, 1, time.Second,
		takeOp(0, 10*ms, history.OK),
		giveOp(100*ms, 110*ms, history.OK),
		takeOp(900*ms, 910*ms, history.SoldOut))
	if got != porcupine.Ok {
		t.Errorf("a refusal 0.79s after the unit came back, bound 1s: %s, want ok", got)
	}
}

// A give makes the sold-out answers after it illegal once the bound has
// passed since it, not before; a give whose outcome is unknown does not
// (it may never have happened).
func TestSoldOutModelAGiveEndsTheRefusalsPastTheBound(t *testing.T) {
	before := []soOp{takeOp(0, 10*ms, history.SoldOut), takeOp(20*ms, 30*ms, history.SoldOut)}
	withGive := func(out history.Outcome, refusedAt time.Duration) []soOp {
		return append(append([]soOp(nil), before...), giveOp(50*ms, 60*ms, out), takeOp(refusedAt, refusedAt+10*ms, history.SoldOut))
	}
	if got := checkSO(t, 0, time.Second, withGive(history.OK, 1200*ms)...); got != porcupine.Illegal {
		t.Errorf("refused 1.14s after a give answered, bound 1s: %s, want illegal", got)
	}
	if got := checkSO(t, 0, time.Second, withGive(history.OK, 1000*ms)...); got != porcupine.Ok {
		t.Errorf("refused 0.94s after a give answered, bound 1s: %s, want ok", got)
	}
	if got := checkSO(t, 0, time.Second, withGive(history.Unknown, 3000*ms)...); got != porcupine.Ok {
		t.Errorf("refused long after a give of unknown outcome: %s, want ok", got)
	}
}

// The bound relaxes refusals only: a 201 needs its unit between its call
// and its return, and the stock is never oversold.
func TestSoldOutModelDoesNotRelaxSales(t *testing.T) {
	if got := checkSO(t, 0, time.Second, takeOp(0, 500*ms, history.OK), giveOp(1000*ms, 1010*ms, history.OK)); got != porcupine.Illegal {
		t.Errorf("a 201 answered before its unit came back: %s, want illegal", got)
	}
	if got := checkSO(t, 1, time.Second, takeOp(0, 10*ms, history.OK), takeOp(20*ms, 30*ms, history.OK)); got != porcupine.Illegal {
		t.Errorf("two units sold from a stock of one: %s, want illegal", got)
	}
	if got := checkSO(t, 1, time.Second, takeOp(0, 10*ms, history.OK), takeOp(20*ms, 30*ms, history.Unknown),
		giveOp(40*ms, 50*ms, history.OK), takeOp(60*ms, 70*ms, history.OK)); got != porcupine.Ok {
		t.Errorf("an order of unknown outcome that did not happen, then a sale of the unit given back: %s, want ok", got)
	}
}
