package explore_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/explore"
)

// TestFencedWriteValidatesTheRead replays, through the lock strategy, every
// order of {A reads, B reads, A writes, B writes} for two holders of the same
// lock — A's lock expires unseen after A takes it, and B takes it next — and
// the commit whose answer is lost while it is still in flight, on both
// engines. With the version check the answers are exact: the first write
// wins, the other holder is told sold out (B, whose lock is valid, reads
// again) or fenced off (A, whose lock is gone). The same schedules run on
// the write as it was before the fix (fence only), which must oversell where
// both reads came before both writes.
func TestFencedWriteValidatesTheRead(t *testing.T) {
	// Each case names its steps as the harness does; a holder whose write
	// is refused reads again in a new transaction ("X: read" once more).
	expired := []string{"A: acquire", "lock expires", "B: acquire"}
	// then lists steps after the expiry.
	then := func(steps ...string) []string { return append(slices.Clone(expired), steps...) }
	cases := []struct {
		name  string
		stock int64
		// steps is the schedule of the strategy; before is the same
		// schedule for the write before the fix, which takes the row lock
		// ("read for update") before its write and never reads again.
		steps, before []string
		want          []string // A's and B's answers with the fix
		left          int64    // available after the schedule, with the fix
		// oversold: the write before the fix ends at −1 here.
		oversold bool
	}{
		{name: "A reads, B reads, A writes, B writes", stock: 1,
			steps:  then("A: read", "B: read", "A: write", "A: commit", "B: write", "B: read"),
			before: then("A: read", "B: read", "A: read for update", "A: write", "A: commit", "B: read for update", "B: write", "B: commit"),
			want:   []string{"created", "sold_out"}, oversold: true},
		{name: "A reads, B reads, B writes, A writes", stock: 1,
			steps:  then("A: read", "B: read", "B: write", "B: commit", "A: write", "A: read"),
			before: then("A: read", "B: read", "B: read for update", "B: write", "B: commit", "A: read for update", "A: write"),
			want:   []string{"busy", "created"}},
		{name: "A reads, A writes, B reads, B writes", stock: 1,
			steps:  then("A: read", "A: write", "A: commit", "B: read"),
			before: then("A: read", "A: read for update", "A: write", "A: commit", "B: read"),
			want:   []string{"created", "sold_out"}},
		{name: "B reads, A reads, A writes, B writes", stock: 1,
			steps:  then("B: read", "A: read", "A: write", "A: commit", "B: write", "B: read"),
			before: then("B: read", "A: read", "A: read for update", "A: write", "A: commit", "B: read for update", "B: write", "B: commit"),
			want:   []string{"created", "sold_out"}, oversold: true},
		{name: "B reads, A reads, B writes, A writes", stock: 1,
			steps:  then("B: read", "A: read", "B: write", "B: commit", "A: write", "A: read"),
			before: then("B: read", "A: read", "B: read for update", "B: write", "B: commit", "A: read for update", "A: write"),
			want:   []string{"busy", "created"}},
		{name: "B reads, B writes, A reads, A writes", stock: 1,
			steps:  then("B: read", "B: write", "B: commit", "A: read"),
			before: then("B: read", "B: read for update", "B: write", "B: commit", "A: read"),
			want:   []string{"busy", "created"}},
		// The version check costs no sale: B reads again and buys the unit
		// that is still there.
		{name: "A reads, B reads, A writes, B writes, with 2 left", stock: 2, left: 0,
			steps:  then("A: read", "B: read", "A: write", "A: commit", "B: write", "B: read", "B: write", "B: commit"),
			before: then("A: read", "B: read", "A: read for update", "A: write", "A: commit", "B: read for update", "B: write", "B: commit"),
			want:   []string{"created", "created"}},
		// No pause at all: A's COMMIT is in flight when its answer is
		// lost, and A's lock expires while A waits for that commit to
		// resolve its order (the lookup waits for the row: A's order does
		// not give up before it lands). B reads the old level, its write
		// waits for A's row lock and finds the row changed.
		{name: "A's commit answer lost while B reads and writes", stock: 1,
			steps: []string{"A: acquire", "A: read", "A: write", "A: commit, answer lost", "lock expires",
				"B: acquire", "B: read", "B: write", "A (late commit): late commit", "B: read"},
			before: []string{"A: acquire", "A: read", "A: read for update", "A: write", "A: commit, answer lost", "lock expires",
				"B: acquire", "B: read", "B: read for update", "A (late commit): late commit", "B: write", "B: commit"},
			want: []string{"created", "sold_out"}, oversold: true},
	}
	// Two: the last case loses a commit's answer and the lock.
	faults := explore.Faults{Max: 2, LeaseExpiry: true, LostCommitAnswer: true}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			ctx := context.Background()
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					fixed := explore.Scenario{Name: c.name, Stock: c.stock, Quantities: []int64{1, 1}, Faults: faults,
						Strategy: func(env explore.Env) inventory.Strategic {
							return locked.New(strategies.NameRedisLock, env.Locker)
						}}
					run, err := x.Replay(ctx, fixed, c.steps)
					if err != nil {
						t.Fatalf("with the fix: %v", err)
					}
					if !slices.Equal(run.Outcomes, c.want) || run.Audit.Available != c.left || len(run.Problems) > 0 {
						t.Errorf("answers %v (want %v), %d left (want %d), problems %v\n    schedule: %s",
							run.Outcomes, c.want, run.Audit.Available, c.left, run.Problems, strings.Join(run.Schedule, " → "))
					}

					// The write before the fix takes its fence under the row
					// lock (a "read for update" step) before it writes.
					before := fixed
					before.Strategy = func(env explore.Env) inventory.Strategic { return fenceOnly{env.Locker} }
					run, err = x.Replay(ctx, before, c.before)
					if err != nil {
						t.Fatalf("before the fix: %v", err)
					}
					if c.oversold != (run.Audit.Available < 0) {
						t.Errorf("before the fix: %d left, oversold %v, want oversold %v\n    schedule: %s",
							run.Audit.Available, run.Audit.Available < 0, c.oversold, strings.Join(run.Schedule, " → "))
					}
				})
			}
		})
	}
}
