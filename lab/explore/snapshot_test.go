package explore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/explore"
	"github.com/flashsale/stock/lab/testdb"
)

// openSnapshotIsolation is open for MariaDB with innodb_snapshot_isolation=ON
// in the session: the server default from MariaDB 11.6.2 on. The driver sets
// unknown DSN parameters as session variables.
func openSnapshotIsolation(t *testing.T) *explore.Explorer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := testdb.URL(t, "mysql")
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "innodb_snapshot_isolation=ON"
	db, err := store.Open(ctx, url, 8)
	if err != nil {
		// The variable exists from MariaDB 10.6.18 and 10.11.8 on; MySQL
		// has none. An older server cannot run the case: not a failure.
		t.Skipf("open mysql with innodb_snapshot_isolation=ON (a server without it: MySQL, or MariaDB before 10.6.18): %v", err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	waits, err := explore.ObserveWaits(ctx, url)
	if err != nil {
		t.Fatalf("observe waits: %v", err)
	}
	t.Cleanup(waits.Close)
	return withReservations(t, explore.New(db, waits.Blocked), db, func(db store.Store) reservation.Sink { return db })
}

// TestSnapshotIsolationStaleRead: "the version check validates the read"
// rests, on MariaDB, on InnoDB evaluating an UPDATE's WHERE on the latest
// committed row. With innodb_snapshot_isolation=ON (MariaDB's default from
// 11.6.2) an UPDATE of a row changed since the transaction's snapshot fails
// with error 1020 instead of matching no row. The adapter files 1020 as a
// conflict, so the transaction runs again on a fresh snapshot: the holder
// whose lock is valid, with a unit still there, buys it (it was answered
// 500 before; found by review). Likewise version-cas without any fault.
func TestSnapshotIsolationStaleRead(t *testing.T) {
	x := openSnapshotIsolation(t)
	ctx := context.Background()
	faults := explore.Faults{Max: 1, LeaseExpiry: true, LostCommitAnswer: true}

	t.Run("redis-lock, 2 left", func(t *testing.T) {
		sc := explore.Scenario{Name: "locked", Stock: 2, Quantities: []int64{1, 1}, Faults: faults,
			Strategy: func(env explore.Env) inventory.Strategic {
				return locked.New(strategies.NameRedisLock, env.Locker)
			}}
		steps := []string{"A: acquire", "lock expires", "B: acquire", "A: read", "B: read", "A: write", "A: commit", "B: write"}
		run, err := x.Replay(ctx, sc, steps)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"created", "created"}; !slices.Equal(run.Outcomes, want) || len(run.Problems) > 0 {
			t.Errorf("answers %v (want %v), %d left, problems %v\n    schedule: %s",
				run.Outcomes, want, run.Audit.Available, run.Problems, strings.Join(run.Schedule, " → "))
		}
	})
	t.Run("version-cas, no fault", func(t *testing.T) {
		sc := explore.Scenario{Name: "cas", Stock: 2, Quantities: []int64{1, 1}, Faults: explore.Faults{},
			Strategy: func(explore.Env) inventory.Strategic {
				return sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(0), sqlrow.WithBackoff(0, 0))
			}}
		steps := []string{"A: read", "B: read", "A: write", "A: commit", "B: write"}
		run, err := x.Replay(ctx, sc, steps)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"created", "created"}; !slices.Equal(run.Outcomes, want) || len(run.Problems) > 0 {
			t.Errorf("answers %v (want %v), %d left, problems %v\n    schedule: %s",
				run.Outcomes, want, run.Audit.Available, run.Problems, strings.Join(run.Schedule, " → "))
		}
	})
}

// TestSnapshotIsolationEverySchedule walks every schedule of two buyers for
// one unit and for two, of each safe strategy, on MariaDB with
// innodb_snapshot_isolation=ON.
func TestSnapshotIsolationEverySchedule(t *testing.T) {
	x := openSnapshotIsolation(t)
	ctx := context.Background()
	for _, c := range candidates() {
		if c.unsafe {
			continue
		}
		for _, stock := range []int64{1, 2} {
			sc := explore.Scenario{Name: fmt.Sprintf("%s, snapshot isolation, 2 buyers for %d", c.name, stock), Stock: stock,
				Quantities: []int64{1, 1}, Strategy: c.strategy, Faults: c.faults, MaxSchedules: 2000, Reserved: c.reserved}
			r, err := x.Explore(ctx, sc)
			if err != nil {
				t.Fatalf("%s: %v", sc.Name, err)
			}
			t.Log(r)
			for _, f := range r.Failures {
				t.Errorf("%s: %s", sc.Name, f)
			}
		}
	}
}
