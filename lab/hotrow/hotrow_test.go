package hotrow_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/hotrow"
	"github.com/flashsale/stock/lab/testdb"
)

// TestMeasureCountsEveryCommittedOrder runs each statement briefly on each
// engine and checks the tally against the database's own bookkeeping: every
// committed transaction is one unit gone and one order row.
func TestMeasureCountsEveryCommittedOrder(t *testing.T) {
	for _, engine := range store.Engines {
		for _, stmt := range hotrow.Statements {
			t.Run(engine+"/"+stmt.Name, func(t *testing.T) {
				ctx := context.Background()
				db, err := store.Open(ctx, testdb.URL(t, engine), 4)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(db.Close)
				if err := db.Migrate(ctx); err != nil {
					t.Fatal(err)
				}
				res, err := hotrow.Measure(ctx, db, stmt, "hot-1",
					hotrow.WithWorkers(4), hotrow.WithDuration(300*time.Millisecond), hotrow.WithKeepOrders(true))
				if err != nil {
					t.Fatal(err)
				}
				if res.Committed == 0 || res.PerSecond <= 0 || res.P50 <= 0 || res.P99 < res.P50 {
					t.Fatalf("implausible result: %+v", res)
				}
				audit, err := db.Audit(ctx, "hot-1")
				if err != nil {
					t.Fatal(err)
				}
				if audit.Orders != res.Committed || audit.Ordered != res.Committed || !audit.Consistent() {
					t.Errorf("measured %d committed, the database has %+v", res.Committed, audit)
				}
			})
		}
	}
}

// TestMeasureCleansUp: without WithKeepOrders the measurement's orders are
// deleted again.
func TestMeasureCleansUp(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(ctx, testdb.URL(t, "postgres"), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := hotrow.Measure(ctx, db, hotrow.Conditional, "hot-2",
		hotrow.WithWorkers(2), hotrow.WithDuration(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	audit, err := db.Audit(ctx, "hot-2")
	if err != nil {
		t.Fatal(err)
	}
	if audit.Orders != 0 || audit.Initial != 0 {
		t.Errorf("orders left behind: %+v", audit)
	}
}
