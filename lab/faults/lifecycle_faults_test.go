package faults_test

import (
	"context"
	"testing"

	"github.com/flashsale/stock/lab/faults"
)

// TestShortLifecycleFaults runs the short forms of scenario 11 (orders that
// come back, HOLD_TTL=2s, PER_USER_LIMIT=1; about 8 s of load each) against
// real processes, on a private PostgreSQL and a private MariaDB of the
// test's own (the database crash must never hit the machine's servers):
// on PostgreSQL the instance caught with a sweep transaction open killed
// -9, and the database server killed -9 while one is open; on MariaDB the
// database crash (cmd/stock's TestKillMidSweep kills a sweeper mid-sweep
// on MariaDB, and make faults runs this one too). About a minute here.
// Every run must come out exact: every 201 an order row, every pay,
// cancel and read answer true to the final rows, every unit of a
// cancelled or expired order back once, no buyer above the limit, and
// each order's history linearizable. `make faults` runs the full forms.
func TestShortLifecycleFaults(t *testing.T) {
	env := shortEnv(t)
	ctx := context.Background()
	runs := []struct {
		engine string
		start  func(context.Context) (*faults.DBServer, error)
		faults []string
	}{
		{"postgres", faults.StartPostgres, []string{faults.LifecycleSweeperKill, faults.LifecycleDatabaseCrash}},
		{"mysql", faults.StartMariaDB, []string{faults.LifecycleDatabaseCrash}},
	}
	for _, c := range runs {
		t.Run(c.engine, func(t *testing.T) {
			server, err := c.start(ctx)
			if err != nil {
				unavailable(t, "a private %s server: %v", c.engine, err)
			}
			t.Cleanup(server.Close)
			for _, fault := range c.faults {
				t.Run(fault, func(t *testing.T) {
					r := env.LifecycleFault(ctx, c.engine, server, fault)
					switch r.Verdict {
					case faults.VerdictSkipped:
						unavailable(t, "%s", r.Error)
					case faults.VerdictError, faults.VerdictFailed:
						t.Fatalf("%s\nfailures: %q\nerror: %s", r.Line, r.Failures, r.Error)
					case faults.VerdictDegraded:
						// Availability on a loaded 2-core machine is not what
						// this test proves; the full suite reports it.
						t.Logf("degraded: %q", r.Warnings)
					}
					lf := r.Lifecycle
					t.Logf("%s; %+v", r.Line, *lf)
					if lf.Created == 0 || lf.Paid == 0 || lf.ExpiredOrders == 0 || lf.CaughtRows == 0 || lf.CheckedOrders == 0 {
						t.Errorf("the run did not exercise the lifecycle under its fault: %+v", *lf)
					}
					if r.Linearizability.Result != "ok" {
						t.Errorf("per-order check: %s", r.Linearizability.Result)
					}
				})
			}
		})
	}
}
