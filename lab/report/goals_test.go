package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// serviceOnly is a run's cost in which the service spent per of CPU on
// each of answered answers.
func serviceOnly(answered int64, per time.Duration) *CPUCost {
	return &CPUCost{Window: time.Second, Answered: answered, Components: []ComponentCost{
		{Name: ComponentService, Processes: 3, CPU: per * time.Duration(answered)},
	}}
}

// ratioBurst is one side of a ratio burst's round: sold 201s in sell.
func ratioBurst(strategy string, round int, perSec float64) GoBurst {
	sell := time.Duration(3000 / perSec * float64(time.Second))
	return GoBurst{Backend: "postgres", Strategy: strategy, Round: round, Stock: 3000, Buyers: 9000, Workers: 300,
		Orders: 3000, SoldOut: 6000, SellWindow: sell, Duration: sell + 100*time.Millisecond, OrdersPerSec: perSec,
		P99Sold: 40 * time.Millisecond, P99SoldOut: 20 * time.Millisecond, Cost: serviceOnly(9000, 60*time.Microsecond),
		Audit: &Audit{Initial: 3000, Ordered: 3000, Orders: 3000, Consistent: true}}
}

func TestCostGoals(t *testing.T) {
	r := fixture(t)
	r.GoLoadGen = &GoLoadGen{Workers: 64, Duration: time.Second, Cost: serviceOnly(100_000, 40*time.Microsecond)}
	r.SoldOutRuns = []GoBurst{{Backend: "postgres", Strategy: "conditional", Round: 1, Buyers: 20_000, SoldOut: 20_000, P99: 9 * time.Millisecond,
		Cost: serviceOnly(20_000, 70*time.Microsecond), Audit: &Audit{Initial: 300, Ordered: 300, Orders: 300, Consistent: true}}}

	rows := soldOutGoalRows(r, r.Rows(Burst))
	var cond *soldOutGoalRow
	for i := range rows {
		if rows[i].Backend == r.BackendLabel("postgres") && rows[i].Strategy == "conditional" {
			cond = &rows[i]
		}
	}
	if cond == nil {
		t.Fatalf("no sold-out goal row for PostgreSQL conditional: %+v", rows)
	}
	// 70 µs against /healthz's 40: 1.75× (shown 1.8×), over the 1.5× goal.
	if cond.Service != "70.0" || cond.VsHealthz != "1.8×" || cond.CPUMet != "no" {
		t.Errorf("sold-out CPU: %+v, want 70.0 (µs, in the header), 1.8×, not met", *cond)
	}
	// The baseline measured beside the run wins over the ceiling run's.
	r.SoldOutRuns[0].Healthz = serviceOnly(20_000, 60*time.Microsecond)
	for _, row := range soldOutGoalRows(r, r.Rows(Burst)) {
		if row.Strategy == "conditional" && row.Backend == r.BackendLabel("postgres") && (row.Healthz != "60.0" || row.CPUMet != "yes") {
			t.Errorf("against the /healthz beside it: %+v, want 60.0 (µs) and met", row)
		}
	}
	r.SoldOutRuns[0].Healthz = nil
	r.SoldOutRuns[0].Cost = serviceOnly(20_000, 50*time.Microsecond)
	if got := soldOutGoalRows(r, r.Rows(Burst)); got[0].CPUMet != "yes" && got[1].CPUMet != "yes" {
		t.Errorf("50 µs against 40 is within 1.5×: %+v", got)
	}

	// Pairs by round; the ratio is the median of the pairs' ratios, and a
	// round with one side missing is no pair.
	r.RatioBursts = []GoBurst{
		ratioBurst("redis-reserve", 1, 6000), ratioBurst("conditional", 1, 1000),
		ratioBurst("redis-reserve", 2, 4000), ratioBurst("conditional", 2, 1000),
		ratioBurst("conditional", 3, 1000),
		ratioBurst("redis-reserve", 4, 5500), ratioBurst("conditional", 4, 1100),
	}
	num, den := r.RatioPairs("postgres")
	if len(num) != 3 || len(den) != 3 {
		t.Fatalf("pairs: %d and %d, want 3", len(num), len(den))
	}
	ratios := ratioRows(r)
	if len(ratios) != 1 {
		t.Fatalf("ratio rows: %+v", ratios)
	}
	if got := ratios[0]; !strings.HasPrefix(got.Ratio, "5× (6× · 4× · 5×)") || got.Met != "yes" || got.Numerator != "5,500 (6,000 · 4,000 · 5,500)" {
		t.Errorf("ratio row: %+v, want a median of 5× over the pairs 6×, 4×, 5×, met", got)
	}
	r.RatioBursts[2].OrdersPerSec = 3000 // the pairs: 6×, 3×, 5×
	if got := ratioRows(r)[0]; !strings.HasPrefix(got.Ratio, "5×") {
		t.Errorf("ratio: %s, want the median pair's 5×", got.Ratio)
	}
	r.RatioBursts[6].OrdersPerSec = 1500 // 6×, 3×, 3.67×
	if got := ratioRows(r)[0]; got.Met != "no" {
		t.Errorf("a median under 5× met the goal: %+v", got)
	}
	// An audit that does not conserve the stock fails the run.
	r.RatioBursts[0].Audit = &Audit{Initial: 3000, Available: -1, Ordered: 3001, Orders: 3001}
	var found bool
	for _, f := range r.Failures() {
		found = found || strings.Contains(f, "postgres/redis-reserve ratio burst round 1")
	}
	if !found {
		t.Errorf("an oversold ratio burst is not among the failures: %q", r.Failures())
	}

	var md, html bytes.Buffer
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## The cost goals: sold out, the fast paths, the ratio burst", "| at least 5× |", "**no**"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	for _, want := range []string{"<h2>The cost goals: sold out, the fast paths, the ratio burst</h2>", "<b>no</b>"} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
