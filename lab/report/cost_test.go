package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// sellCost is a burst's selling window in which the service, the database
// and k6 spent servicePer, databasePer and loadGenPer of CPU per order.
func sellCost(sold int64, servicePer, databasePer, loadGenPer time.Duration, busy float64, unmeasured time.Duration) *CPUCost {
	n := time.Duration(sold)
	c := &CPUCost{Window: 2 * time.Second, Answered: sold, Sold: sold, MachineBusy: busy, Components: []ComponentCost{
		{Name: ComponentService, Processes: 3, CPU: servicePer * n, Busiest: servicePer * n / 3},
		{Name: ComponentDatabase, Processes: 1, CPU: databasePer * n, Busiest: databasePer * n},
		{Name: ComponentLoadGen, Processes: 1, CPU: loadGenPer * n, Busiest: loadGenPer * n},
	}}
	c.MachineCPU = (servicePer+databasePer+loadGenPer)*n + unmeasured
	return c
}

// costFixture is the fixture with a cost on PostgreSQL's conditional burst
// whose every component's CPU per order makes the in-run prediction
// measured ÷ factor.
func costFixture(t *testing.T, busy, factor float64, unmeasured time.Duration) (*Report, float64) {
	t.Helper()
	r := fixture(t)
	r.Capacity = &Capacity{ServiceCores: 8, DatabaseCores: 8}
	var measured float64
	for _, row := range r.Rows(Burst) {
		if row.Run.Backend == "postgres" && row.Run.Strategy == "conditional" {
			measured = row.Stats.OrdersPerSec
			// 2 cores over the total per order = measured / factor.
			total := time.Duration(2e6 / (measured / factor) * float64(time.Microsecond))
			row.Run.SellCost = sellCost(300, total/4, total/2, total/4, busy, unmeasured)
			row.Run.Cost = row.Run.SellCost
		}
	}
	if measured == 0 {
		t.Fatal("the fixture has no PostgreSQL conditional burst")
	}
	return r, measured
}

func TestCapacityBindsOnTheLowestBound(t *testing.T) {
	r, _ := costFixture(t, 0.97, 1.1, 0)
	rows := capacityRows(r, r.Rows(Burst))
	if len(rows) != 1 {
		t.Fatalf("%d capacity rows, want 1 (only the conditional burst has a cost)", len(rows))
	}
	c := rows[0]
	// Some 1,800 µs of service and 3,700 of database per order on 8
	// cores each is over 2,000 orders/s: the hot row's 800/s binds.
	if c.Estimate != "800" || c.Binds != "hot row" {
		t.Errorf("estimate %s bound by %q, want 800 by the hot row", c.Estimate, c.Binds)
	}
	if c.Check != "within ±25%" || c.Outside {
		t.Errorf("check %q (%s), want within ±25%%", c.Check, c.CheckWhy)
	}
}

func TestCapacityCheckSaysWhyARateIsOutside(t *testing.T) {
	// Saturated, but half the busy CPU in processes nobody measured.
	r, _ := costFixture(t, 0.97, 2, 2*time.Second)
	c := capacityRows(r, r.Rows(Burst))[0]
	if !c.Outside || c.Check != "outside ±25%" || !strings.Contains(c.CheckWhy, "not measured") {
		t.Errorf("check %q: %q; want outside, blamed on unmeasured processes", c.Check, c.CheckWhy)
	}
}

func TestCapacityCheckSkipsRunsWhereTheCoresWereNotTheLimit(t *testing.T) {
	r, _ := costFixture(t, 0.5, 2, 0)
	c := capacityRows(r, r.Rows(Burst))[0]
	if c.Outside || c.Check != "cores not the limit" || !strings.Contains(c.CheckWhy, "50% busy") || !strings.Contains(c.CheckWhy, "hot row") {
		t.Errorf("check %q: %q; want cores not the limit, 50%% busy, with the hot row named", c.Check, c.CheckWhy)
	}
}

func TestCostRowsShowNotMeasuredComponents(t *testing.T) {
	r, _ := costFixture(t, 0.97, 1, 0)
	for _, run := range r.Runs {
		if run.Cost != nil {
			run.Cost.Components[1] = ComponentCost{Name: ComponentDatabase, Error: "nothing listens on 127.0.0.1:5432"}
		}
	}
	r.LoadGen.Cost = &CPUCost{Window: time.Second, Answered: 10_000, Components: []ComponentCost{{Name: ComponentService, CPU: time.Second}, {Name: ComponentLoadGen, CPU: time.Second}}}
	var found, healthz bool
	for _, row := range costRows(r, r.Rows(Burst), r.Rows(Steady)) {
		if row.Strategy == "conditional" {
			found = true
			if row.Database != "not measured" || !strings.Contains(row.Note, "127.0.0.1:5432") || row.StackPerCoreSec != "–" {
				t.Errorf("row = %+v: want the database not measured, its reason, and no whole-stack figure", row)
			}
		}
		if row.Healthz {
			healthz = true
			if row.Service != "100" || row.ServicePerCoreSec != "10,000" {
				t.Errorf("healthz row = %+v: want 100 (µs, in the header) and 10,000 requests per core-second", row)
			}
		}
	}
	if !found || !healthz {
		t.Errorf("cost rows lack the burst (%v) or /healthz (%v)", found, healthz)
	}
}

func TestRenderCostAndCapacity(t *testing.T) {
	r, _ := costFixture(t, 0.97, 1, 0)
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Cost per order: CPU by component", `class="c-service"`, `class="c-database"`,
		"Capacity: orders/s on a machine of 8 cores for the service and 8 for the database", "within ±25%"} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	for _, want := range []string{"## Cost per order: CPU by component", "## Capacity", "| **800** | hot row |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}
