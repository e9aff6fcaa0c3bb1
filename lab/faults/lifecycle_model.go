package faults

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The lifecycle's history is checked order by order: once placed, an order
// is a register of four states (held, paid, cancelled, expired) that
// pays, cancels and reads act on, and that the expiry may move from held
// to expired at any moment from its expires_at on — not a client's
// operation, so the model lets it happen nondeterministically before any
// operation that ends at or after expires_at. An order's units are checked
// by the rows (checkLifecycleRows: every unit of a cancelled or expired
// order back exactly once); what porcupine adds is that every answer a
// buyer got, and the state the rows end in, fit one order of the
// operations, each at an instant between its call and its return.
//
// Times are the wall clock in microseconds: the database, on the same
// machine, stamps expires_at with that clock (its now() plus HOLD_TTL), and
// a pay or a cancel moves the order only while expires_at is ahead of the
// database's clock at the move, an expiry only once it is not. So a pay
// answered 200 was called before expires_at, an answer of expired came
// back after it; lcClockSlack allows for the two reading the clock apart.
const lcClockSlack = 10 * time.Millisecond

// lcInput is one operation on an order: pay, cancel, read (a GET, or the
// final read of the rows at the end of the run, "final"), with its times and
// the order's expires_at.
type lcInput struct {
	Kind      string
	Call, Ret int64 // wall clock, µs; Ret is the answer's, even for an unknown outcome
	Expires   int64 // wall clock, µs
}

// lcOutput is the state the answer says the order is in ("paid",
// "cancelled", "expired", "held"), or "" when the client never learned the
// outcome (the operation may or may not have taken effect).
type lcOutput string

func lcSteps(state string, in lcInput, out lcOutput) []any {
	slack := lcClockSlack.Microseconds()
	// Before the hold lapsed by the database's clock, a pay or a cancel may
	// move it; from then on only the expiry. The move happens between call
	// and return: a move from held is possible only if called early
	// enough, an expiry only if it returned late enough.
	live := state == "held" && in.Call < in.Expires+slack
	lapsed := state == "held" && in.Ret+slack >= in.Expires
	var next []any
	add := func(ok bool, s string) {
		if ok && !slices.Contains(next, any(s)) {
			next = append(next, s)
		}
	}
	switch in.Kind {
	case lcPay, lcCancel:
		to := map[string]string{lcPay: "paid", lcCancel: "cancelled"}[in.Kind]
		switch out {
		case lcOutput(to):
			add(state == to || live, to) // the move, or its idempotent repeat
		case "expired":
			add(state == "expired" || lapsed, "expired")
		case "paid", "cancelled":
			add(state == string(out), state) // the other move won earlier
		case "":
			add(true, state)
			add(live, to)
			add(lapsed, "expired")
		}
	default: // read, final
		switch out {
		case "held":
			// A read of a lapsed hold expires it on the spot (lazy expiry).
			add(live, "held")
		case "expired":
			add(state == "expired" || lapsed, "expired")
		case "":
			add(true, state)
			add(lapsed, "expired")
		default:
			add(state == string(out), state)
		}
	}
	return next
}

var lcModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{"held"} },
	Step: func(state, input, output any) []any {
		return lcSteps(state.(string), input.(lcInput), output.(lcOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lcInput), output.(lcOutput)
		if out == "" {
			out = "?"
		}
		return fmt.Sprintf("%s -> %s (called %+.3fs, answered %+.3fs from expires_at)", in.Kind, out,
			float64(in.Call-in.Expires)/1e6, float64(in.Ret-in.Expires)/1e6)
	},
	DescribeState: func(state any) string { return state.(string) },
}).ToModel()

// lcOrderHistory is the operations of one order.
type lcOrderHistory struct {
	ID  string
	Ops []porcupine.Operation
}

// lcVerdict is the check of every order's history.
type lcVerdict struct {
	Orders, Operations int
	Illegal            []string // ids of the orders whose history is not linearizable
	Unknown            int      // orders the checker gave up on
	Visualization      string   // of the first illegal order, when a folder was given
}

// checkOrders checks each order's history, giving up on one after timeout.
func checkOrders(histories []lcOrderHistory, timeout time.Duration, dir string) (lcVerdict, error) {
	var v lcVerdict
	for _, h := range histories {
		v.Orders++
		v.Operations += len(h.Ops)
		res, info := porcupine.CheckOperationsVerbose(lcModel, h.Ops, timeout)
		switch res {
		case porcupine.Ok:
			continue
		case porcupine.Unknown:
			v.Unknown++
			continue
		}
		v.Illegal = append(v.Illegal, h.ID)
		if dir != "" && v.Visualization == "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return v, err
			}
			v.Visualization = filepath.Join(dir, "order-"+h.ID+".html")
			if err := porcupine.VisualizePath(lcModel, info, v.Visualization); err != nil {
				return v, err
			}
		}
	}
	return v, nil
}

// lcOperation is a porcupine operation of an order: an unknown outcome may
// have taken effect at any time after its call.
func lcOperation(client int, in lcInput, out lcOutput) porcupine.Operation {
	ret := in.Ret
	if out == "" {
		ret = math.MaxInt64
	}
	return porcupine.Operation{ClientId: client, Input: in, Output: out, Call: in.Call, Return: ret}
}
