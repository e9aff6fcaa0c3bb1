package faults

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashsale/stock/lab/history"
)

// The sold-out mark's history (scenario 13) is checked SKU by SKU against a
// stock counter that orders take from and returns give back to (soModel).
//
// A 409 sold_out may come from the store, or from an instance's mark: one
// refusal of the store, sent at most SOLD_OUT_TTL before the marked
// refusal's call (inventory.soldOutMarks), linearized after it was sent
// and before the marked refusal was answered. So a sold-out answer is
// legal iff fewer units than it asked for were available at some instant
// in [call − bound, return], bound being SOLD_OUT_TTL plus a slack for the
// instances' clocks; soOperations moves each sold-out answer's call that
// much earlier and porcupine does the rest. A 201 keeps its true call: the
// mark only ever refuses.
//
// Nothing else is relaxed: a take answered 201 needs its units at an
// instant between its call and its return, a give (a cancel answered 200
// cancelled, a restock answered 200) adds its units at one, and an
// operation whose outcome the client never learned may have taken effect
// at any time after its call, or never.

// soKind is what an operation does to the stock.
type soKind int8

const (
	soTake soKind = iota // an order
	soGive               // a cancel of a held order, or a restock
)

// soOp is one operation on a SKU's stock as the load saw it: Call and Ret
// on the load's clock; Outcome history.OK, history.SoldOut (takes only) or
// history.Unknown.
type soOp struct {
	Kind      soKind
	Units     int64
	Call, Ret time.Duration
	Outcome   history.Outcome
	Client    int
}

// soInput is porcupine's input of one operation.
type soInput struct {
	Kind  soKind
	Units int64
}

// soModel is a stock counter starting at initial that takes and gives
// change; an unknown outcome may or may not have changed it.
func soModel(initial int64) porcupine.Model {
	m := &porcupine.NondeterministicModel{
		Init: func() []any { return []any{initial} },
		Step: func(state, input, output any) []any {
			s, in := state.(int64), input.(soInput)
			q := in.Units
			if in.Kind == soGive {
				switch output.(history.Outcome) {
				case history.OK:
					return []any{s + q}
				case history.Unknown:
					return []any{s, s + q}
				}
				return nil
			}
			switch output.(history.Outcome) {
			case history.OK:
				if s >= q {
					return []any{s - q}
				}
				return nil
			case history.SoldOut:
				if s < q {
					return []any{s}
				}
				return nil
			case history.Unknown:
				if s >= q {
					return []any{s, s - q}
				}
				return []any{s}
			}
			return nil
		},
		DescribeOperation: func(input, output any) string {
			in := input.(soInput)
			if in.Kind == soGive {
				return fmt.Sprintf("give %d -> %v", in.Units, output.(history.Outcome))
			}
			return fmt.Sprintf("take %d -> %v", in.Units, output.(history.Outcome))
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%d left", state.(int64)) },
	}
	return m.ToModel()
}

// soOperations turns a SKU's operations into porcupine's: each sold-out
// answer's call moved bound earlier (it may rest on a refusal made up to
// bound before it), each unknown outcome open to the end of time.
func soOperations(ops []soOp, bound time.Duration) []porcupine.Operation {
	out := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		call, ret := int64(op.Call), int64(op.Ret)
		switch op.Outcome {
		case history.SoldOut:
			call -= int64(bound)
		case history.Unknown:
			ret = math.MaxInt64
		}
		out = append(out, porcupine.Operation{ClientId: op.Client, Input: soInput{Kind: op.Kind, Units: op.Units},
			Output: op.Outcome, Call: call, Return: ret})
	}
	return out
}

// checkSoldOutHistory checks one SKU's operations against a stock of
// initial units, each sold-out answer allowed to rest on a state up to
// bound before its call; it gives up after timeout (porcupine.Unknown).
// When the result is not Ok and visualize is not empty, porcupine's HTML
// is written there.
func checkSoldOutHistory(ops []soOp, initial int64, bound, timeout time.Duration, visualize string) (porcupine.CheckResult, error) {
	model := soModel(initial)
	result, info := porcupine.CheckOperationsVerbose(model, soOperations(ops, bound), timeout)
	if result != porcupine.Ok && visualize != "" {
		if err := os.MkdirAll(filepath.Dir(visualize), 0o755); err != nil {
			return result, err
		}
		if err := porcupine.VisualizePath(model, info, visualize); err != nil {
			return result, fmt.Errorf("visualize %s: %w", visualize, err)
		}
	}
	return result, nil
}
