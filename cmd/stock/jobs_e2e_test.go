package main

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/lab/testdb"
)

// metricValue reads one series of an instance's /metrics (0 when absent).
func metricValue(t *testing.T, p *process, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(metricsText(t, p.url))
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestAuditJobOncePerPeriodAcrossInstances: three instances run the audit
// job (AUDIT_EVERY) under the lock table's job lock: in all, it runs once a
// period, and the instance that ran it last reports the SKU whose stock row
// was tampered with.
func TestAuditJobOncePerPeriodAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	const every = 500 * time.Millisecond
	url := testdb.URL(t, "postgres")
	var instances []*process
	for range 3 {
		instances = append(instances, startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional",
			"AUDIT_EVERY="+every.String()))
	}
	for _, sku := range []string{"fine", "tampered"} {
		adminJSON(t, http.MethodPut, instances[0].url+"/admin/stock/"+sku, `{"available":10}`, nil)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// A unit vanishes without an order: initial != available + ordered.
	if _, err := conn.Exec(ctx, `UPDATE stock SET available = available - 1 WHERE sku = 'tampered'`); err != nil {
		t.Fatal(err)
	}

	runs := func() (sum float64, each []float64) {
		for _, p := range instances {
			v := metricValue(t, p, `stock_job_runs_total{job="audit"}`)
			each = append(each, v)
			sum += v
		}
		return sum, each
	}
	// Count the runs over a number of whole periods, from a run to a run.
	waitRuns := func(atLeast float64) (float64, time.Time) {
		tick := time.NewTicker(every / 20)
		defer tick.Stop()
		for {
			if n, _ := runs(); n >= atLeast {
				return n, time.Now()
			}
			select {
			case <-tick.C: // polling other processes' metrics: there is no event to wait on
			case <-ctx.Done():
				n, each := runs()
				t.Fatalf("the audit ran %v times in all (%v per instance), want at least %v", n, each, atLeast)
			}
		}
	}
	first, from := waitRuns(1)
	const periods = 8
	ctx, cancel = context.WithTimeout(t.Context(), (periods+4)*every)
	defer cancel()
	last, to := waitRuns(first + periods)
	elapsed := to.Sub(from)
	_, each := runs()
	t.Logf("%v runs in %v (%v per instance)", last-first, elapsed.Round(time.Millisecond), each)
	// Runs twice a period would come in half the time.
	if min := time.Duration(last-first-1) * every; elapsed < min*9/10 {
		t.Fatalf("%v runs in %v: more than one a period of %v", last-first, elapsed, every)
	}
	inconsistent := 0.0
	for _, p := range instances {
		inconsistent = max(inconsistent, metricValue(t, p, "stock_audit_inconsistent_skus"))
	}
	if inconsistent != 1 {
		t.Fatalf("stock_audit_inconsistent_skus = %v on the instances that ran the audit, want 1", inconsistent)
	}
}

// TestSweepReturnsLapsedHoldsAcrossInstances: two instances with HOLD_TTL
// hold three orders; nobody reads, pays or cancels them, so only the sweep
// job (HOLD_SWEEP_EVERY, one instance a period) can give their units back.
// The expiry itself is under test: the test waits for it, polling the
// audit, which reads without expiring anything.
func TestSweepReturnsLapsedHoldsAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			url := testdb.URL(t, engine)
			var instances []*process
			for range 2 {
				instances = append(instances, startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional",
					"HOLD_TTL=1s", "HOLD_SWEEP_EVERY=200ms"))
			}
			adminJSON(t, http.MethodPut, instances[0].url+"/admin/stock/lapse", `{"available":3}`, nil)
			for i := range 3 {
				if status, err := postOrder(instances[i%2].url, "lapse", "u"+strconv.Itoa(i)); err != nil || status != http.StatusCreated {
					t.Fatalf("order %d: %d %v", i, status, err)
				}
			}
			if status, _ := postOrder(instances[0].url, "lapse", "late"); status != http.StatusConflict {
				t.Fatalf("an order while every unit is held: %d, want 409", status)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
			defer cancel()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				var a struct {
					Available, Held, Expired, Returned int64
					Consistent                         bool
				}
				adminJSON(t, http.MethodGet, instances[1].url+"/admin/audit/lapse", "", &a)
				if a.Expired == 3 {
					if !a.Consistent || a.Available != 3 || a.Held != 0 || a.Returned != 3 {
						t.Fatalf("after the sweep: %+v, want the 3 units back once", a)
					}
					break
				}
				select {
				case <-tick.C: // the sweep runs in other processes: nothing to wait on but the rows
				case <-ctx.Done():
					t.Fatalf("the sweep did not expire the lapsed holds: %+v", a)
				}
			}
			if status, err := postOrder(instances[0].url, "lapse", "late"); err != nil || status != http.StatusCreated {
				t.Fatalf("an order after the sweep returned the units: %d %v", status, err)
			}
			swept := 0.0
			for _, p := range instances {
				swept += metricValue(t, p, `stock_orders_settled_total{state="expired",strategy="conditional"}`)
			}
			if swept != 3 {
				t.Errorf("stock_orders_settled_total{state=\"expired\"} = %v over the instances, want 3", swept)
			}
		})
	}
}
