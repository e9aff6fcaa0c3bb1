package explore_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/explore"
)

// oneLane is the batched strategy with every SKU in one lane, so that the
// schedule's SKUs share their batches.
func oneLane(env explore.Env) inventory.Strategic {
	return batched.New(env.Store, batched.WithQueueObserver(env.Queue), batched.WithLanes(1),
		batched.WithLogger(slog.New(slog.DiscardHandler)))
}

// TestABatchOfTwoSKUsDecidesEachOnItsOwn: B, C and D join while A's
// batch runs and form one batch of two SKUs: on the first, B's unit fits
// the conditional UPDATE; on the second, C's and D's two do not fit the
// one unit left, so the batch locks that row, reads 1 and takes C's, and
// D is sold out. One transaction, both SKUs exact.
func TestABatchOfTwoSKUsDecidesEachOnItsOwn(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			sc := explore.Scenario{Name: "batched across SKUs", Stocks: []int64{2, 1}, SKUOf: []int{0, 0, 1, 1},
				Quantities: []int64{1, 1, 1, 1}, Strategy: oneLane}
			steps := []string{"A: join the batch queue", "B: join the batch queue", "C: join the batch queue", "D: join the batch queue"}
			run, err := x.Replay(context.Background(), sc, steps)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"created", "created", "created", "sold_out"}
			schedule := strings.Join(run.Schedule, " → ")
			if !slices.Equal(run.Outcomes, want) || len(run.Problems) > 0 {
				t.Errorf("answers %v (want %v), problems %v\n    schedule: %s", run.Outcomes, want, run.Problems, schedule)
			}
			if !strings.Contains(schedule, "B: read for update") || strings.Count(schedule, "commit") != 2 {
				t.Errorf("want A's batch and then one batch of B, C and D that locks the second SKU's row\n    schedule: %s", schedule)
			}
		})
	}
}

// TestEveryScheduleOfABatchAcrossSKUs explores batches that span SKUs, on
// both engines: one batch of two SKUs, one of which fits and one of which
// does not; and two instances batching the same two SKUs, their buyers
// arriving in opposite orders (instance 1: a then b; instance 2: b then
// a), with lost commit answers. Nothing oversold on either SKU, every
// answer true to the rows, each SKU's history linearizable, and no
// deadlock (the rows are taken in SKU order).
func TestEveryScheduleOfABatchAcrossSKUs(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			s := seed(t)
			for _, sc := range []explore.Scenario{
				{Name: "one batch of two SKUs, one fits and one does not", Stocks: []int64{1, 1}, SKUOf: []int{0, 1, 1},
					Quantities: []int64{1, 1, 1}, MaxSchedules: scaled(t, 400), Samples: scaled(t, 50)},
				{Name: "two instances batching two SKUs in opposite orders", Stocks: []int64{1, 1}, SKUOf: []int{0, 1, 1, 0},
					Quantities: []int64{1, 1, 1, 1}, Instances: 2, MaxSchedules: scaled(t, 200), Samples: scaled(t, 50)},
			} {
				sc.Name = fmt.Sprintf("batched, %s, on %s", sc.Name, engine)
				sc.Strategy, sc.Faults, sc.Seed = oneLane, explore.Faults{Max: 1, LostCommitAnswer: true}, s
				r, err := x.Explore(context.Background(), sc)
				if err != nil {
					t.Fatalf("%s: %v", sc.Name, err)
				}
				t.Log(r)
				for _, f := range r.Failures {
					t.Errorf("%s: %s", sc.Name, f)
				}
			}
		})
	}
}
