package faults

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestLifecycleModel holds the per-order model to what the service may and
// may not answer: legal histories (races with the expiry either way, an
// unknown outcome, idempotent repeats) pass, and wrong ones — a unit paid
// after the rows say it expired, a pay answered 200 long after the hold
// lapsed, a pay after a cancel that had been answered, a paid row nobody
// paid, an order answered expired before its hold could lapse — are
// caught. The control of the checker: without it, a model that accepts
// everything would pass every run.
func TestLifecycleModel(t *testing.T) {
	const exp = int64(10_000_000) // expires_at, µs
	s := int64(time.Second / time.Microsecond)
	op := func(kind string, call, ret int64, out lcOutput) porcupine.Operation {
		return lcOperation(0, lcInput{Kind: kind, Call: call, Ret: ret, Expires: exp}, out)
	}
	final := func(state lcOutput) porcupine.Operation { return op("final", exp+5*s, exp+5*s, state) }
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"paid in time", []porcupine.Operation{op(lcPay, exp-s, exp-s+100, "paid"), final("paid")}, true},
		{"paid, paid again", []porcupine.Operation{op(lcPay, exp-s, exp-s+100, "paid"), op(lcPay, exp-s+200, exp-s+300, "paid"), final("paid")}, true},
		{"pay races the expiry and loses", []porcupine.Operation{op(lcPay, exp-100, exp+100, "expired"), final("expired")}, true},
		{"pay races the expiry and wins", []porcupine.Operation{op(lcPay, exp-100, exp+100, "paid"), final("paid")}, true},
		{"abandoned", []porcupine.Operation{final("expired")}, true},
		{"a read, then the sweep", []porcupine.Operation{op(lcRead, exp-s, exp-s+10, "held"), final("expired")}, true},
		{"pay of unknown outcome that happened", []porcupine.Operation{op(lcPay, exp-s, exp+s, ""), final("paid")}, true},
		{"pay of unknown outcome that did not", []porcupine.Operation{op(lcPay, exp-s, exp+s, ""), final("expired")}, true},
		{"cancel, then a pay told cancelled", []porcupine.Operation{op(lcCancel, exp-s, exp-s+100, "cancelled"), op(lcPay, exp-s+200, exp-s+300, "cancelled"), final("cancelled")}, true},
		{"concurrent pay and cancel, cancel wins", []porcupine.Operation{op(lcPay, exp-s, exp-s+500, "cancelled"), op(lcCancel, exp-s+10, exp-s+400, "cancelled"), final("cancelled")}, true},

		{"paid, the rows say expired", []porcupine.Operation{op(lcPay, exp-s, exp-s+100, "paid"), final("expired")}, false},
		{"paid long after the hold lapsed", []porcupine.Operation{op(lcPay, exp+s, exp+s+100, "paid"), final("paid")}, false},
		{"pay after an answered cancel", []porcupine.Operation{op(lcCancel, exp-s, exp-s+100, "cancelled"), op(lcPay, exp-s+200, exp-s+300, "paid"), final("paid")}, false},
		{"a paid row nobody paid", []porcupine.Operation{final("paid")}, false},
		{"expired before the hold could lapse", []porcupine.Operation{op(lcPay, exp-2*s, exp-s, "expired"), final("expired")}, false},
		{"cancelled, then the rows say paid", []porcupine.Operation{op(lcCancel, exp-s, exp-s+100, "cancelled"), final("paid")}, false},
		{"held after an answered expiry", []porcupine.Operation{op(lcCancel, exp+10, exp+100, "expired"), op(lcRead, exp+200, exp+300, "held"), final("expired")}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := checkOrders([]lcOrderHistory{{ID: "o", Ops: c.ops}}, 5*time.Second, "")
			if err != nil {
				t.Fatal(err)
			}
			if got := len(v.Illegal) == 0 && v.Unknown == 0; got != c.legal {
				t.Errorf("linearizable = %v, want %v", got, c.legal)
			}
		})
	}
}
