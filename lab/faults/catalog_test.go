package faults_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/faults"
)

// TestShortCatalogFaults runs the short forms of scenario 9 with 1,000 SKUs
// on sale and a load skewed towards a few hot ones, on redis-reserve: its
// Redis restarted from its append-only file and wiped, the database
// crashed and an instance killed; and redis-watch's row of the restart
// table (scenario 10) for 1,000 SKUs. About 2 minutes here. Whatever the
// size of the catalog, the reservation strategies must sell again within
// a second of a Redis restart: the first 201 within a second of the
// restarted Redis answering, and the first orders of the SKUs ordered
// after it answered 201 or 409 within a second at the median. And in every
// run every SKU must come out exact: the audit adds up, nothing oversold,
// every 201 an order row, no row of a request told otherwise. `make
// faults` runs the full forms (10,000 SKUs, and each fault on redis-watch,
// batched and conditional too).
func TestShortCatalogFaults(t *testing.T) {
	env := shortEnv(t)
	ctx := context.Background()
	// Every run's database is on a PostgreSQL of the test's own, as in
	// lab/cmd/faults: the database crash must never hit the machine's server,
	// and three instances with a catalog each want dozens of connections,
	// which the machine's shared server (100 at most) may not have left.
	postgres, err := faults.StartPostgres(ctx)
	if err != nil {
		unavailable(t, "a private PostgreSQL: %v", err)
	}
	t.Cleanup(postgres.Close)
	env.NewDatabase = func(ctx context.Context, engine string) (string, error) {
		return postgres.NewDatabase(ctx, "faults_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	}
	runs := []struct {
		name string
		run  func() faults.Result
		// sellsWithin: the first 201 after the fault must come within
		// this (0: no bound).
		sellsWithin time.Duration
	}{
		{"redis-restart/redis-reserve", func() faults.Result {
			return env.CatalogRedisRestart(ctx, strategies.NameRedisReserve)
		}, time.Second},
		{"redis-wiped/redis-reserve", func() faults.Result {
			return env.CatalogRedisWiped(ctx, strategies.NameRedisReserve)
		}, 0},
		{"database-kill/redis-reserve", func() faults.Result {
			return env.CatalogDatabaseKill(ctx, postgres, strategies.NameRedisReserve)
		}, 0},
		{"instance-kill/redis-reserve", func() faults.Result {
			return env.CatalogInstanceKill(ctx, "postgres", strategies.NameRedisReserve)
		}, 0},
		// One instance: the cheapest way to hold redis-watch to the same
		// second.
		{"restart-table/redis-watch/1000-skus", func() faults.Result {
			return env.RestartTable(ctx, strategies.NameRedisWatch, 1000)
		}, time.Second},
	}
	for _, c := range runs {
		t.Run(c.name, func(t *testing.T) {
			r := c.run()
			switch r.Verdict {
			case faults.VerdictSkipped:
				unavailable(t, "%s", r.Error)
			case faults.VerdictError, faults.VerdictFailed:
				t.Fatalf("%s\nfailures: %q\nerror: %s", r.Line, r.Failures, r.Error)
			case faults.VerdictDegraded:
				t.Logf("degraded: %q", r.Warnings)
			}
			if r.Figures.OversoldUnits != 0 || r.Figures.LostOrders != 0 {
				t.Errorf("oversold %d units, lost %d orders", r.Figures.OversoldUnits, r.Figures.LostOrders)
			}
			if r.Figures.Created == 0 {
				t.Errorf("nothing was sold: %s", r.Line)
			}
			cat := r.Catalog
			if cat == nil {
				t.Fatalf("no catalog figures: %s", r.Line)
			}
			if cat.Audited < cat.SKUs || cat.Exact != cat.Audited {
				t.Errorf("%d of %d sales exact (catalog of %d SKUs); worst: %+v", cat.Exact, cat.Audited, cat.SKUs, cat.Worst)
			}
			a := cat.AfterFault
			if a != nil {
				t.Logf("after the fault (%s): first 201 %s; %.1f 201/s (%.1f before); %d 503; %d SKUs ordered, first answer %.3fs at the median, %.3fs at the slowest (%s), %d refused",
					a.What, fmtSeconds(a.FirstCreatedS), a.CreatedPerSecond, a.CreatedPerSecondBefore, a.Responses503,
					a.SKUsOrdered, a.MedianFirstAnswerS, a.SlowestFirstAnswerS, a.SlowestSKU, a.SKUsFirstRefused)
			}
			if c.sellsWithin > 0 {
				// From the restarted Redis answering: the service cannot
				// sell before, and Redis's own time to load its file grows
				// with the file (a few hundred kilobytes here).
				rec := firstSaleAfterRestart(r)
				if rec == nil || *rec > c.sellsWithin.Seconds() {
					t.Errorf("first 201 after the restarted Redis answered: %v, want within %v (%s after the restart began; %s)",
						fmtSeconds(rec), c.sellsWithin, fmtSeconds(r.Figures.RecoverySeconds), r.Line)
				}
				// The slowest SKU is not held to the second, nor is every
				// first order held to a 201 or 409: on a 2-core machine
				// shared with the rest of the suite one check in a hundred
				// can take longer, and the service's Redis client may still
				// refuse to dial for up to a second after a long outage
				// (go-redis probes a server it gave up on once a second).
				// Both are reported (the full form warns).
				if a == nil || a.SKUsOrdered == 0 || a.MedianFirstAnswerS > c.sellsWithin.Seconds() {
					t.Errorf("SKUs ordered after the restart: %+v; want their first orders answered 201 or 409 within %v at the median", a, c.sellsWithin)
				}
			}
			t.Logf("%d SKUs put on sale in %.1fs; %d of %d sales exact; worst %+v", cat.SKUs, cat.SetupSeconds, cat.Exact, cat.Audited, cat.Worst)
			for _, n := range r.Notes {
				t.Logf("note: %s", n)
			}
		})
	}
}

// firstSaleAfterRestart is the time from the restarted Redis answering to
// the first 201.
func firstSaleAfterRestart(r faults.Result) *float64 {
	if r.Restart != nil {
		return r.Restart.FirstCreatedAfterReadyS
	}
	if r.Catalog != nil && r.Catalog.AfterFault != nil {
		return r.Catalog.AfterFault.FirstCreatedS
	}
	return nil
}

func fmtSeconds(s *float64) string {
	if s == nil {
		return "never"
	}
	return time.Duration(*s * float64(time.Second)).String()
}
