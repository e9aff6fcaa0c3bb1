// Package history records what test clients saw of their orders and checks
// each SKU's history for linearizability against a stock counter, with
// porcupine: is there one order of the operations, each taking effect at an
// instant between its call and its return, that a single counter starting at
// the initial stock would have answered exactly so?
//
// A client that timed out or lost its connection does not know whether its
// order happened: such an operation is recorded as Unknown, may or may not
// have taken effect, and may have done so at any time after its call.
package history

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/flashsale/stock/internal/inventory"
)

// Outcome is what a client learned of one order.
type Outcome int

const (
	// OK: the order was accepted (201).
	OK Outcome = iota
	// SoldOut: refused because too little stock was left (409).
	SoldOut
	// NoEffect: refused without touching stock for another reason (503
	// busy, 400, 404...).
	NoEffect
	// Unknown: no answer, or an answer that does not say (timeout, lost
	// connection, 503 unavailable): the order may or may not have happened.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case SoldOut:
		return "sold out"
	case NoEffect:
		return "no effect"
	}
	return "unknown"
}

// Op is one order as a client saw it. Times are nanoseconds since the
// recorder started, on the monotonic clock.
type Op struct {
	Client   int
	SKU      string
	Quantity int64
	Call     int64
	Return   int64
	Outcome  Outcome
}

// Recorder collects operations from many goroutines.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewRecorder returns an empty recorder whose clock starts now.
func NewRecorder() *Recorder { return &Recorder{start: time.Now()} }

// Begin notes the call of an order and returns the function that notes its
// return with the outcome the client saw.
func (r *Recorder) Begin(client int, sku string, quantity int64) func(Outcome) {
	call := time.Since(r.start).Nanoseconds()
	return func(o Outcome) {
		ret := time.Since(r.start).Nanoseconds()
		r.mu.Lock()
		r.ops = append(r.ops, Op{Client: client, SKU: sku, Quantity: quantity, Call: call, Return: ret, Outcome: o})
		r.mu.Unlock()
	}
}

// Ops returns a copy of what was recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Op(nil), r.ops...)
}

// Verdict is the checker's answer for one SKU.
type Verdict struct {
	SKU string
	Ops int
	// Result is porcupine's: Ok, Illegal, or Unknown when the check ran out
	// of time.
	Result porcupine.CheckResult
	// Reason says why, when a shortcut decided the result.
	Reason string
	// Visualization is the path of porcupine's HTML rendering of the
	// history, written when the result is not Ok and a folder was given.
	Visualization string
}

// Linearizable reports whether the checker proved the history linearizable.
func (v Verdict) Linearizable() bool { return v.Result == porcupine.Ok }

func (v Verdict) String() string {
	s := fmt.Sprintf("%s: %d operations, %s", v.SKU, v.Ops, v.Result)
	if v.Reason != "" {
		s += ": " + v.Reason
	}
	if v.Visualization != "" {
		s += " (see " + v.Visualization + ")"
	}
	return s
}

// stockModel is a counter that orders take from.
func stockModel(initial int64) porcupine.Model {
	m := &porcupine.NondeterministicModel{
		Init: func() []any { return []any{initial} },
		Step: func(state, input, output any) []any {
			s, q := state.(int64), input.(int64)
			switch output.(Outcome) {
			case OK:
				if s >= q {
					return []any{s - q}
				}
				return nil
			case SoldOut:
				if s < q {
					return []any{s}
				}
				return nil
			case NoEffect:
				return []any{s}
			}
			if s >= q {
				return []any{s, s - q}
			}
			return []any{s}
		},
		DescribeOperation: func(input, output any) string {
			return fmt.Sprintf("take %d -> %v", input.(int64), output.(Outcome))
		},
		DescribeState: func(state any) string { return fmt.Sprintf("%d left", state.(int64)) },
	}
	return m.ToModel()
}

// Check checks each SKU's operations against a counter that starts at
// initial[sku], giving up on one SKU after timeout (its result is then
// Unknown). When visualizeDir is not empty, the history of a SKU that is not
// proven linearizable is written there as HTML.
func Check(ops []Op, initial map[string]int64, timeout time.Duration, visualizeDir string) ([]Verdict, error) {
	bySKU := map[string][]porcupine.Operation{}
	var end int64
	for _, op := range ops {
		end = max(end, op.Return)
	}
	for _, op := range ops {
		ret := op.Return
		if op.Outcome == Unknown {
			// It may have taken effect at any time after its call.
			ret = math.MaxInt64
		}
		bySKU[op.SKU] = append(bySKU[op.SKU], porcupine.Operation{
			ClientId: op.Client, Input: op.Quantity, Output: op.Outcome, Call: op.Call, Return: ret,
		})
	}
	skus := make([]string, 0, len(bySKU))
	for sku := range bySKU {
		skus = append(skus, sku)
	}
	sort.Strings(skus)

	var verdicts []Verdict
	for _, sku := range skus {
		n, ok := initial[sku]
		if !ok {
			return nil, fmt.Errorf("history: no initial stock for %q", sku)
		}
		model := stockModel(n)
		v := Verdict{SKU: sku, Ops: len(bySKU[sku])}
		// A history that sold more than the stock is illegal whatever the
		// order, and proving it by search is exponential: say so at once,
		// and give the search only a moment for the visualisation.
		searchFor := timeout
		if sold := soldUnits(bySKU[sku]); sold > n {
			v.Result, v.Reason = porcupine.Illegal, fmt.Sprintf("%d units sold from a stock of %d", sold, n)
			searchFor = min(timeout, time.Second)
		}
		result, info := porcupine.CheckOperationsVerbose(model, bySKU[sku], searchFor)
		if v.Result == "" {
			v.Result = result
		}
		if v.Result != porcupine.Ok && visualizeDir != "" {
			if err := os.MkdirAll(visualizeDir, 0o755); err != nil {
				return nil, err
			}
			v.Visualization = filepath.Join(visualizeDir, "history-"+sku+".html")
			if err := porcupine.VisualizePath(model, info, v.Visualization); err != nil {
				return nil, fmt.Errorf("history: visualize %s: %w", sku, err)
			}
		}
		verdicts = append(verdicts, v)
	}
	return verdicts, nil
}

// soldUnits adds up the quantities of the accepted orders.
func soldUnits(ops []porcupine.Operation) int64 {
	var sold int64
	for _, op := range ops {
		if op.Output.(Outcome) == OK {
			sold += op.Input.(int64)
		}
	}
	return sold
}

// OutcomeOf is what a client learns from an order's error: a 201, a sold
// out, nothing (a refusal that took nothing), or, for a 503, that the
// order may have happened (an unknown commit).
func OutcomeOf(err error) Outcome {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, inventory.ErrSoldOut):
		return SoldOut
	case errors.Is(err, inventory.ErrUnavailable):
		return Unknown
	}
	return NoEffect
}
