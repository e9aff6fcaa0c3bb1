package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// kneeSteps are catalogs of conditional at 100, 200 and 400 workers with
// the orders/s given, every SKU exact.
func kneeSteps(rates ...float64) []*Catalog {
	var steps []*Catalog
	for i, rate := range rates {
		c := catalogOf("conditional", 100, nil)
		c.Workers, c.OrdersPerSec = 100<<i, rate
		steps = append(steps, c)
	}
	return steps
}

// TestKneeStopsWhereOrdersPerSecondStopsRising: a step runs after another
// only while each raised orders/s by at least 10% over every step before
// it.
func TestKneeStopsWhereOrdersPerSecondStopsRising(t *testing.T) {
	for _, tc := range []struct {
		rates  []float64
		rising bool
	}{
		{[]float64{1000}, true},
		{[]float64{1000, 1500}, true},
		{[]float64{1000, 1090}, false},
		{[]float64{1000, 1500, 1200}, false},
		{[]float64{1000, 1500, 1700}, true},
	} {
		if got := KneeRising(kneeSteps(tc.rates...)); got != tc.rising {
			t.Errorf("steps %v: rising %v, want %v", tc.rates, got, tc.rising)
		}
	}
}

// TestKneeFigureIsTheFastestStepUnlessOneFailed: the row of a knee shows its
// step with the most orders/s, every step's beside it, and flat from the
// fewest workers within 10% of the best; a step that failed its audit is
// the row, failed, however fast the others were.
func TestKneeFigureIsTheFastestStepUnlessOneFailed(t *testing.T) {
	steps := kneeSteps(1000, 1500, 1400)
	c := KneeFigure(steps)
	if c != steps[1] || len(c.Knee) != 3 || c.KneeAt() != 200 {
		t.Fatalf("figure at %d workers, %d steps, flat from %d: want the 200 workers' step, 3 steps, flat from 200", c.Workers, len(c.Knee), c.KneeAt())
	}
	if v := c.Judge(); v.Status != StatusOK {
		t.Errorf("verdict %+v, want ok", v)
	}
	if got := c.kneeText(func(s string) string { return "[" + s + "]" }, nil); got != "100 → 1,000 · [200 → 1,500] · 400 → 1,400" {
		t.Errorf("knee text %q", got)
	}

	bad := kneeSteps(1000, 1500, 1400)
	bad[2] = catalogOf("conditional", 100, oversellRank3)
	bad[2].Workers, bad[2].OrdersPerSec = 400, 1700
	c = KneeFigure(bad)
	if c != bad[2] {
		t.Fatalf("figure at %d workers, want the step that oversold", c.Workers)
	}
	if v := c.Judge(); v.Status != StatusFail {
		t.Errorf("verdict %+v, want fail", v)
	}
	// A failed step that is not the figure still fails the row.
	first := kneeSteps(1000, 1500)
	first[0] = catalogOf("conditional", 100, oversellRank3)
	first[0].Workers, first[0].OrdersPerSec = 100, 1000
	c = KneeFigure(first)
	if v := c.Judge(); c != first[0] || v.Status != StatusFail {
		t.Errorf("figure at %d workers, verdict %+v: want the failed first step, failed", c.Workers, v)
	}
}

// TestCatalogTableShowsTheKnee: the catalog's row gives every step's
// orders/s, the figure's step marked, and the section says how the load
// was raised.
func TestCatalogTableShowsTheKnee(t *testing.T) {
	r := fixture(t)
	r.CatalogRuns = []*Catalog{KneeFigure(kneeSteps(1000, 1500, 1400))}
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`workers → orders/s:<br><span class="nw">100 → 1,000</span> · <b class="nw">200 → 1,500</b> · <span class="nw">400 → 1,400</span>`, "flat from 200 workers",
		"For conditional the load is raised step by step (100, 200, 400 workers)"} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	for _, want := range []string{"| 1,500 (workers → orders/s: 100 → 1,000 · **200 → 1,500** · 400 → 1,400; flat from 200 workers) |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

// TestCatalogRowGivesTheDatabasesCPUPerSaleBesideTheBursts: the catalog's
// database CPU per 201 is shown, and as a multiple of the same strategy's
// burst on one hot SKU (issue 38's goal: at most 2×).
func TestCatalogRowGivesTheDatabasesCPUPerSaleBesideTheBursts(t *testing.T) {
	r := fixture(t)
	for _, row := range r.Rows(Burst) {
		if row.Run.Backend == "postgres" && row.Run.Strategy == "conditional" {
			// 300 sold at 40 µs of database each.
			row.Run.SellCost = sellCost(300, 10*time.Microsecond, 40*time.Microsecond, 10*time.Microsecond, 0.5, 0)
		}
	}
	c := catalogOf("conditional", 100, nil)
	c.Cost = &CPUCost{Answered: 600, Sold: 65, Components: []ComponentCost{{Name: ComponentDatabase, CPU: 65 * 60 * time.Microsecond}}}
	r.CatalogRuns = []*Catalog{c}
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	if want := `<span class="nw">database 60 µs a 201</span>,<br><span class="nw">1.5× the burst's</span>`; !strings.Contains(html.String(), want) {
		t.Errorf("the page lacks %q", want)
	}
	if want := "database 60 µs a 201, 1.5× the burst's"; !strings.Contains(md.String(), want) {
		t.Errorf("report.md lacks %q", want)
	}
}

// TestCatalogGoalsSayWhichHold: batched's catalog against its burst, against
// conditional's catalog and in database CPU a 201, each marked.
func TestCatalogGoalsSayWhichHold(t *testing.T) {
	r := fixture(t)
	r.Strategies = append(r.Strategies, "batched")
	for _, run := range r.Runs {
		if run.Backend == "postgres" && run.Strategy == "conditional" && run.Scenario == Burst {
			b := *run
			b.Strategy, b.Dir, b.Dashboard = "batched", "runs/postgres-batched/burst", ""
			b.SellCost = sellCost(300, 10*time.Microsecond, 40*time.Microsecond, 10*time.Microsecond, 0.5, 0)
			r.Runs = append(r.Runs, &b)
			break
		}
	}
	batched := KneeFigure(kneeSteps(250, 300))
	batched.Strategy = "batched"
	batched.Cost = &CPUCost{Answered: 600, Sold: 100, Components: []ComponentCost{{Name: ComponentDatabase, CPU: 100 * 100 * time.Microsecond}}}
	r.CatalogRuns = []*Catalog{catalogOf("conditional", 100, nil), batched}
	var md bytes.Buffer
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	// 300 orders/s against a burst of 267 and conditional's 32.5; 100 µs
	// of database a 201 against the burst's 40.
	want := "| PostgreSQL | batched | 300 | 200 workers | 1.1× | yes | 9.2× | yes | 100 µs | 2.5× | **no** |"
	if !strings.Contains(md.String(), want) {
		t.Errorf("report.md lacks %q:\n%s", want, md.String())
	}
}

// TestCatalogChartShowsTheControlsSwatchOnlyWithAControl: the chart's legend
// names the control's colour only when a control's bars are drawn.
func TestCatalogChartShowsTheControlsSwatchOnlyWithAControl(t *testing.T) {
	r := fixture(t)
	burst := r.Rows(Burst)
	r.CatalogRuns = []*Catalog{catalogOf("conditional", 100, nil)}
	if chart := string(catalogChart(r, "postgres", burst)); strings.Contains(chart, "control") {
		t.Error("a chart without a control names the control's colour")
	}
	r.CatalogRuns = append(r.CatalogRuns, catalogOf("naive", 100, oversellRank3))
	if chart := string(catalogChart(r, "postgres", burst)); !strings.Contains(chart, "control") {
		t.Error("a chart with a control does not name its colour")
	}
}
