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
// batch runs and form one batch of two SKUs. Its first statement locks
// and reads both rows and deducts what fits: on the first SKU, B's unit;
// on the second, C's and D's two do not fit the one unit left, so the
// batch plans that SKU again from the row the statement read under its
// lock (1 left), without reading it again: C's is taken by a second
// statement and D is sold out. One transaction, both SKUs exact.
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
			if !strings.Contains(schedule, "B: write → B: write → B: commit") || strings.Contains(schedule, "read for update") ||
				strings.Count(schedule, "commit") != 2 {
				t.Errorf("want A's batch and then one batch of B, C and D that deducts twice and reads no row again\n    schedule: %s", schedule)
			}
		})
	}
}

// TestEveryScheduleOfABatchAcrossSKUs explores batches that span SKUs, on
// both engines: one batch of two SKUs, one of which fits and one of which
// does not; and two instances batching the same two SKUs, their buyers
// arriving in opposite orders (instance 1: a then b; instance 2: b then
// a), with lost commit answers; and two instances on one SKU, where one
// finds the row the other holds and moves its orders to the SKU's own
// queue. Nothing oversold on either SKU, every
// answer true to the rows, each SKU's history linearizable, and no
// deadlock (the rows are taken in SKU order).
func TestEveryScheduleOfABatchAcrossSKUs(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			s := seed(t)
			// MariaDB's SKIP LOCKED sometimes waits for a row another
			// transaction holds instead of skipping it, which no schedule
			// decides: a schedule that did not replay is run again, and
			// one that still does not is left out and counted (under
			// CI's load one did, once). On PostgreSQL one is a bug.
			retry := 0
			if engine == "mysql" {
				retry = 2
			}
			for _, sc := range []explore.Scenario{
				{Name: "one batch of two SKUs, one fits and one does not", Stocks: []int64{1, 1}, SKUOf: []int{0, 1, 1},
					Quantities: []int64{1, 1, 1}, MaxSchedules: scaled(t, 400), Samples: scaled(t, 50)},
				{Name: "two instances batching two SKUs in opposite orders", Stocks: []int64{1, 1}, SKUOf: []int{0, 1, 1, 0},
					Quantities: []int64{1, 1, 1, 1}, Instances: 2, MaxSchedules: scaled(t, 200), Samples: scaled(t, 50)},
				{Name: "two instances on one SKU, whose row one finds held", Stock: 2,
					Quantities: []int64{1, 1, 1}, Instances: 2, MaxSchedules: scaled(t, 200), Samples: scaled(t, 50)},
			} {
				sc.Name = fmt.Sprintf("batched, %s, on %s", sc.Name, engine)
				sc.Strategy, sc.Faults, sc.Seed, sc.RetryUnreplayed = oneLane, explore.Faults{Max: 1, LostCommitAnswer: true}, s, retry
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

// TestAnInstanceThatFindsTheRowHeldQueuesTheOrderOnItsSKU: two instances,
// one SKU of 1 unit. A's batch (instance 1) locks the row and has not
// committed when B's batch (instance 2) comes to it: B's statement skips
// the held row instead of waiting, and B's order moves to a queue of that
// SKU alone, whose batch waits for the row; once A commits, it finds the
// SKU sold out. Nothing oversold, each answer true to the row.
func TestAnInstanceThatFindsTheRowHeldQueuesTheOrderOnItsSKU(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			sc := explore.Scenario{Name: "batched, a held row", Stock: 1, Quantities: []int64{1, 1}, Instances: 2, Strategy: oneLane}
			steps := []string{"A: join the batch queue", "B: join the batch queue", "A: write", "B: write", "A: commit"}
			run, err := x.Replay(context.Background(), sc, steps)
			if err != nil {
				t.Fatal(err)
			}
			schedule := strings.Join(run.Schedule, " → ")
			want := []string{"created", "sold_out"}
			if !slices.Equal(run.Outcomes, want) || run.Audit.Available != 0 || len(run.Problems) > 0 {
				t.Errorf("answers %v (want %v), %d left, problems %v\n    schedule: %s",
					run.Outcomes, want, run.Audit.Available, run.Problems, schedule)
			}
			// B's lane batch skipped the row and committed nothing; its
			// order's own batch then took the row after A's commit.
			if !strings.Contains(schedule, "A: write → B: write → A: commit → B: commit → B: write → B: read for update → B: commit") {
				t.Errorf("want B's order decided by a batch of its SKU after A's commit\n    schedule: %s", schedule)
			}
		})
	}
}
