package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// The summaries in testdata/ were written by loadtest/flashsale.js and
// healthz.js in a real quick demo (three instances, PostgreSQL and MariaDB):
//
//	burst-conditional.json   300 units, 1,200 buyers: 300 × 201, 900 × 409, last 201 at 1,125 ms
//	burst-naive.json         the same with naive: 345 × 201, teardown threshold crossed
//	steady-conditional.json  800/s offered: 1,973 × 201, 1,221 dropped
//	steady-version-cas.json  MariaDB: 237 × 201, 76 × 503, 9,166 dropped
//	healthz.json             the load generator's ceiling run
//	catalogs.json            catalog runs of a quick demo (1,000 SKUs of 20 units, 2 s): naive
//	                         oversold 10 SKUs, the worst by 11 units; conditional exact; db-lock's
//	                         set-up refused (503, PostgreSQL out of connections); redis-reserve on
//	                         MariaDB with one Redis and with a Redis Cluster of three masters

func summary(t *testing.T, name string) *Summary {
	t.Helper()
	s, err := ReadSummary(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

func TestParseSummary(t *testing.T) {
	s := summary(t, "burst-naive.json")
	if got := s.Count("orders"); got != 345 {
		t.Errorf("orders = %d, want 345", got)
	}
	if got := s.Count("sold_out"); got != 855 {
		t.Errorf("sold_out = %d, want 855", got)
	}
	if got := s.Count("busy"); got != 0 {
		t.Errorf("busy (never added) = %d, want 0", got)
	}
	if p99, ok := s.Value("order_latency", "p(99)"); !ok || !near(p99, 767.5832316399999) {
		t.Errorf("p99 = %v, %v", p99, ok)
	}
	if v, ok := s.Value("audit_available", "value"); !ok || v != -45 {
		t.Errorf("audit_available gauge = %v, %v; want -45", v, ok)
	}
	if got := s.CrossedThresholds(); len(got) != 1 || got[0] != "checks{group:::teardown} rate==1" {
		t.Errorf("crossed thresholds = %q", got)
	}
	checks := s.GroupChecks("teardown")
	if len(checks) != 2 {
		t.Fatalf("teardown checks = %+v", checks)
	}
	for _, c := range checks {
		if c.Name == "nothing oversold" && c.Fails != 1 {
			t.Errorf("the oversell check should have failed: %+v", c)
		}
		if c.Name == "every sold unit is an order" && c.Fails != 0 {
			t.Errorf("naive conserves units: %+v", c)
		}
	}
	if got := summary(t, "burst-conditional.json").CrossedThresholds(); len(got) != 0 {
		t.Errorf("clean run crossed %q", got)
	}
}

func TestParseSummaryRejectsGarbage(t *testing.T) {
	for _, in := range []string{``, `{`, `{"metrics": null}`, `[]`} {
		if _, err := ParseSummary(strings.NewReader(in)); err == nil {
			t.Errorf("ParseSummary(%q) accepted", in)
		}
	}
}

func TestStats(t *testing.T) {
	burst := (&Run{Scenario: Burst, Summary: summary(t, "burst-conditional.json")}).Stats()
	if burst.Orders != 300 || burst.SoldOut != 900 || burst.Requests != 1200 || burst.Busy != 0 || burst.Errors != 0 {
		t.Errorf("counts: %+v", burst)
	}
	// 300 orders up to the last 201 at 1,125 ms; 1,200 answers up to 1,580 ms.
	if burst.SellWindow != 1125*time.Millisecond || !near(burst.OrdersPerSec, 300/1.125) {
		t.Errorf("orders/s = %v over %v, want %v", burst.OrdersPerSec, burst.SellWindow, 300/1.125)
	}
	if !near(burst.RequestsPerSec, 1200/1.580) {
		t.Errorf("requests/s = %v, want %v", burst.RequestsPerSec, 1200/1.580)
	}
	if !burst.HasLatency || burst.P50.Round(time.Microsecond) != 54165*time.Microsecond || burst.P99 < burst.P95 || burst.P95 < burst.P50 {
		t.Errorf("latency: p50 %v p95 %v p99 %v", burst.P50, burst.P95, burst.P99)
	}

	steady := (&Run{Scenario: Steady, Summary: summary(t, "steady-version-cas.json")}).Stats()
	if steady.Orders != 237 || steady.Busy != 76 || steady.Dropped != 9166 || steady.Requests != 313 {
		t.Errorf("counts: %+v", steady)
	}
	if !near(steady.OrdersPerSec, 237/4.885) {
		t.Errorf("orders/s = %v, want %v", steady.OrdersPerSec, 237/4.885)
	}

	if (&Run{}).Stats() != (Stats{}) {
		t.Error("a run without summary must have zero stats")
	}
}

func TestJudge(t *testing.T) {
	clean := func() *Audit { return &Audit{Initial: 300, Available: 0, Ordered: 300, Orders: 300, Consistent: true} }
	tests := []struct {
		name       string
		run        Run
		status     Status
		oversold   int64
		unrecorded int64
		lost       int64
		conserved  bool
		problem    string
	}{
		{
			name:      "safe strategy, clean audit",
			run:       Run{Strategy: "conditional", Summary: summary(t, "burst-conditional.json"), Audit: clean()},
			status:    StatusOK,
			conserved: true,
		},
		{
			name: "naive oversells: the control doing its job",
			run: Run{Strategy: "naive", ExitCode: 99, Summary: summary(t, "burst-naive.json"),
				Audit: &Audit{Initial: 300, Available: -45, Ordered: 345, Orders: 345, Consistent: false}},
			status: StatusControlOversold, oversold: 45, conserved: true,
		},
		{
			name:      "naive that happened not to oversell",
			run:       Run{Strategy: "naive", Summary: summary(t, "steady-conditional.json"), Audit: &Audit{Initial: 3940, Available: 1967, Ordered: 1973, Orders: 1973}},
			status:    StatusControlHeld,
			conserved: true,
		},
		{
			name: "safe strategy that oversold",
			run: Run{Strategy: "for-update", ExitCode: 99, Summary: summary(t, "burst-naive.json"),
				Audit: &Audit{Initial: 300, Available: -45, Ordered: 345, Orders: 345}},
			status: StatusFail, oversold: 45, conserved: true, problem: "oversold 45 units",
		},
		{
			name: "a 201 without an order row is a lost order",
			run: Run{Strategy: "conditional", Summary: summary(t, "burst-conditional.json"),
				Audit: &Audit{Initial: 300, Available: 1, Ordered: 299, Orders: 299}},
			status: StatusFail, lost: 1, conserved: true, problem: "1 buyers got 201 but have no order row",
		},
		{
			name: "stock gone without an order",
			run: Run{Strategy: "version-cas", Summary: summary(t, "burst-conditional.json"),
				Audit: &Audit{Initial: 305, Available: 0, Ordered: 300, Orders: 300}},
			status: StatusFail, unrecorded: 5, problem: "5 units left the stock without an order",
		},
		{
			name:    "threshold crossed but a clean audit: the two disagree",
			run:     Run{Strategy: "conditional", ExitCode: 99, Summary: summary(t, "burst-naive.json"), Audit: &Audit{Initial: 345, Available: 0, Ordered: 345, Orders: 345}},
			status:  StatusError,
			problem: "but the audit shows no violation", conserved: true,
		},
		{
			name:    "k6 script error",
			run:     Run{Strategy: "conditional", ExitCode: 107, Summary: summary(t, "burst-conditional.json"), Audit: clean()},
			status:  StatusError,
			problem: "k6 exited with status 107", conserved: true,
		},
		{
			name:    "no summary",
			run:     Run{Strategy: "conditional", Audit: clean()},
			status:  StatusError,
			problem: "no k6 summary",
		},
		{
			name:    "instance died",
			run:     Run{Strategy: "conditional", Error: "an instance died during the run", Summary: summary(t, "burst-conditional.json"), Audit: clean()},
			status:  StatusError,
			problem: "run failed: an instance died",
		},
		{
			name:    "no audit",
			run:     Run{Strategy: "naive", Summary: summary(t, "burst-naive.json")},
			status:  StatusError,
			problem: "no audit",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.run.Judge()
			if v.Status != tt.status || v.Oversold != tt.oversold || v.Unrecorded != tt.unrecorded || v.Unconfirmed != tt.lost || v.Conserved != tt.conserved {
				t.Errorf("verdict %+v; want status %s oversold %d unrecorded %d lost %d conserved %v",
					v, tt.status, tt.oversold, tt.unrecorded, tt.lost, tt.conserved)
			}
			if tt.problem != "" && !strings.Contains(strings.Join(v.Problems, "; "), tt.problem) {
				t.Errorf("problems %q do not mention %q", v.Problems, tt.problem)
			}
			if tt.problem == "" && tt.status == StatusOK && len(v.Problems) > 0 {
				t.Errorf("unexpected problems %q", v.Problems)
			}
		})
	}
}

// fixture is a small report: two backends, conditional and naive, with
// ceilings measured at 48 connections and at 1.
func fixture(t *testing.T) *Report {
	t.Helper()
	clean := &Audit{Initial: 300, Available: 0, Ordered: 300, Orders: 300, Consistent: true}
	return &Report{
		Title:      "test",
		Started:    time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC),
		Finished:   time.Date(2026, 11, 22, 0, 2, 0, 0, time.UTC),
		Mode:       "quick",
		Strategies: []string{"naive", "conditional", "version-cas"},
		Backends:   []string{"postgres", "mysql"},
		Env:        Environment{Host: "vm", Cores: 2, MySQL: "MariaDB 10.11.14-MariaDB", LoadAtStart: "3.50 1.00 0.50"},
		LoadGen:    &LoadGen{RequestsPerSec: 5364, VUs: 64, Duration: 2 * time.Second},
		Ceilings: []Ceiling{
			{Backend: "postgres", Statement: "conditional", Workers: 48, PerSecond: 800},
			{Backend: "postgres", Statement: "for-update", Workers: 48, PerSecond: 669},
			{Backend: "postgres", Statement: "conditional", Workers: 1, PerSecond: 2473},
			{Backend: "mysql", Statement: "conditional", Workers: 48, Error: "connection refused"},
		},
		Runs: []*Run{
			{Backend: "postgres", Strategy: "conditional", Scenario: Burst, Stock: 300, Buyers: 1200, VUs: 100, Instances: 3, Summary: summary(t, "burst-conditional.json"), Audit: clean, Dir: "runs/postgres-conditional/burst", Dashboard: "runs/postgres-conditional/burst/dashboard.html"},
			{Backend: "postgres", Strategy: "naive", Scenario: Burst, Stock: 300, Buyers: 1200, VUs: 100, Instances: 3, ExitCode: 99, Summary: summary(t, "burst-naive.json"), Audit: &Audit{Initial: 300, Available: -45, Ordered: 345, Orders: 345}, Dir: "runs/postgres-naive/burst"},
			{Backend: "postgres", Strategy: "conditional", Scenario: Steady, Rate: 800, Duration: 4 * time.Second, VUs: 100, Instances: 3, Summary: summary(t, "steady-conditional.json"), Audit: &Audit{Initial: 3940, Available: 1967, Ordered: 1973, Orders: 1973}, Dir: "runs/postgres-conditional/steady"},
			{Backend: "postgres", Strategy: "version-cas", Scenario: Steady, Rate: 800, Duration: 4 * time.Second, VUs: 100, Instances: 3, Summary: summary(t, "steady-version-cas.json"), Audit: &Audit{Initial: 3940, Available: 3703, Ordered: 237, Orders: 237}, Dir: "runs/postgres-version-cas/steady"},
			{Backend: "mysql", Strategy: "conditional", Scenario: Burst, Error: "instances did not start: boom"},
		},
	}
}

func TestReferenceCeilingAndRatio(t *testing.T) {
	r := fixture(t)
	ref, ok := r.ReferenceCeiling("postgres")
	// The 1-connection ceiling is faster but is not the service's
	// concurrency: the reference is the fastest at 48 connections.
	if !ok || ref.PerSecond != 800 || ref.Workers != 48 || ref.Statement != "conditional" {
		t.Errorf("reference = %+v, %v", ref, ok)
	}
	if _, ok := r.ReferenceCeiling("mysql"); ok {
		t.Error("a failed ceiling must not be a reference")
	}
	rows := r.Rows(Burst)
	if len(rows) != 3 {
		t.Fatalf("rows = %d", len(rows))
	}
	// Table order: backends, then strategies as listed.
	if rows[0].Run.Strategy != "naive" || rows[1].Run.Strategy != "conditional" || rows[2].Run.Backend != "mysql" {
		t.Errorf("order: %s %s %s", rows[0].Run.Strategy, rows[1].Run.Strategy, rows[2].Run.Backend)
	}
	cond := rows[1]
	if !cond.HasRatio || !near(cond.Ratio, (300/1.125)/800) {
		t.Errorf("ratio = %v (%v), want %v", cond.Ratio, cond.HasRatio, (300/1.125)/800)
	}
	if rows[2].HasRatio {
		t.Error("a backend without a ceiling has no ratio")
	}
}

func TestMedianCeilings(t *testing.T) {
	r := &Report{Ceilings: []Ceiling{
		{Backend: "mysql", Statement: "conditional", Workers: 48, PerSecond: 2141, Round: 1},
		{Backend: "mysql", Statement: "for-update", Workers: 48, PerSecond: 1850, Round: 1},
		{Backend: "mysql", Statement: "conditional", Workers: 48, PerSecond: 757, Round: 2},
		{Backend: "mysql", Statement: "for-update", Workers: 48, Error: "timeout", Round: 2},
		{Backend: "mysql", Statement: "conditional", Workers: 48, PerSecond: 1990, Round: 3},
		{Backend: "mysql", Statement: "for-update", Workers: 48, PerSecond: 191, Round: 3},
	}}
	m := r.MedianCeilings()
	if len(m) != 2 {
		t.Fatalf("%d medians", len(m))
	}
	// A slow spell in one round does not move the reference.
	if m[0].PerSecond != 1990 || m[0].Round != 3 || len(m[0].RoundsPerSec) != 3 || m[0].RoundsPerSec[1] != 757 {
		t.Errorf("conditional median %+v", m[0])
	}
	// Of two good rounds, the lower; the failed one is left out.
	if m[1].PerSecond != 191 || len(m[1].RoundsPerSec) != 2 {
		t.Errorf("for-update median %+v", m[1])
	}
	if ref, ok := r.ReferenceCeiling("mysql"); !ok || ref.PerSecond != 1990 {
		t.Errorf("reference %+v", ref)
	}
	if f := strings.Join(r.Failures(), "\n"); !strings.Contains(f, "hot-row ceiling mysql/for-update from 48 connections round 2: timeout") {
		t.Errorf("failures: %s", f)
	}
}

func TestBest(t *testing.T) {
	r := fixture(t)
	b, ok := r.Best("postgres", Steady)
	if !ok || b.Winner.Run.Strategy != "conditional" || b.RunnerUp == nil || b.RunnerUp.Run.Strategy != "version-cas" {
		t.Fatalf("best = %+v, %v", b, ok)
	}
	want := (1973 / 4.095) / (237 / 4.885)
	if !near(b.Factor, want) || len(b.Tied) != 0 {
		t.Errorf("factor = %v, want %v; tied %d", b.Factor, want, len(b.Tied))
	}
	if _, ok := r.Best("mysql", Burst); ok {
		t.Error("a backend whose runs all failed has no best strategy")
	}
	// The control never wins, however fast.
	b, _ = r.Best("postgres", Burst)
	if b.Winner.Run.Strategy != "conditional" {
		t.Errorf("burst winner = %s", b.Winner.Run.Strategy)
	}
}

func TestBestBreaksTiesOnLatency(t *testing.T) {
	r := fixture(t)
	// A second strategy with the same throughput but a lower p99.
	faster := *r.Runs[2]
	faster.Strategy = "version-cas"
	s := *faster.Summary
	s.Metrics = map[string]Metric{}
	for k, v := range faster.Summary.Metrics {
		s.Metrics[k] = v
	}
	lat := s.Metrics["order_latency"]
	vals := map[string]float64{}
	for k, v := range lat.Values {
		vals[k] = v
	}
	vals["p(99)"] = 100
	lat.Values = vals
	s.Metrics["order_latency"] = lat
	faster.Summary = &s
	r.Runs[3] = &faster

	b, ok := r.Best("postgres", Steady)
	if !ok || b.Winner.Run.Strategy != "version-cas" || len(b.Tied) != 2 || b.RunnerUp.Run.Strategy != "conditional" {
		t.Fatalf("best = winner %s tied %d", b.Winner.Run.Strategy, len(b.Tied))
	}
	if !near(b.P99Factor, 660.02135256/100) {
		t.Errorf("p99 factor = %v", b.P99Factor)
	}
	if got := bestSentence(b, Ceiling{PerSecond: 800}, true); !strings.Contains(got, "version-cas and conditional") || !strings.Contains(got, "lowest p99") {
		t.Errorf("sentence: %s", got)
	}
}

func TestFailures(t *testing.T) {
	r := fixture(t)
	f := strings.Join(r.Failures(), "\n")
	if !strings.Contains(f, "mysql/conditional burst: run failed: instances did not start") {
		t.Errorf("failed run missing:\n%s", f)
	}
	if !strings.Contains(f, "hot-row ceiling mysql/conditional from 48 connections: connection refused") {
		t.Errorf("failed ceiling missing:\n%s", f)
	}
	if strings.Contains(f, "naive") {
		t.Errorf("the control's oversell is not a failure:\n%s", f)
	}

	r.Runs = r.Runs[:4]
	r.Ceilings = r.Ceilings[:3]
	if f := r.Failures(); len(f) != 0 {
		t.Errorf("clean report has failures: %q", f)
	}
	// A safe strategy that oversells is.
	r.Runs[0].Audit = &Audit{Initial: 300, Available: -1, Ordered: 301, Orders: 300}
	if f := strings.Join(r.Failures(), "\n"); !strings.Contains(f, "postgres/conditional burst: oversold 1 units") {
		t.Errorf("oversell of a safe strategy not reported:\n%s", f)
	}
}

func TestRender(t *testing.T) {
	r := fixture(t)
	var html, md bytes.Buffer
	everyFile := func(string) bool { return true }
	if err := WriteHTML(&html, r, everyFile); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	page := html.String()
	for _, want := range []string{
		"<svg", "The demonstration failed", "oversold (control)", `class="badge ok"`,
		"runs/postgres-conditional/burst/dashboard.html", "MariaDB", "115%: 345 of 300 units, 45 oversold",
		"hot row, conditional, 1 connection: 2,473/s", "Load average (1, 5, 15 min) before the run", "machine was busy",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Self-contained: nothing to fetch when opened offline (the page's
	// one script is inline: it opens the section a link leads to).
	for _, bad := range []string{"<script src", `src="http`, `href="http`, "@import", "url(http"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page refers to something outside: %q", bad)
		}
	}
	text := md.String()
	for _, want := range []string{
		"| PostgreSQL | **naive** | 209 |", "| PostgreSQL | conditional | 267 |", "| **45** |",
		"| 800/s | 1,221 |", "instances did not start",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report.md lacks %q:\n%s", want, text)
		}
	}
}

func TestSaveLoad(t *testing.T) {
	r := fixture(t)
	dir := t.TempDir()
	if err := WriteFiles(dir, r); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != len(r.Runs) || got.Runs[0].Audit.Ordered != 300 || got.Ceilings[2].Workers != 1 {
		t.Errorf("round trip lost data: %+v", got)
	}
	// Summaries live beside the report, not in results.json.gz; none were
	// written here, so Load leaves them nil rather than failing.
	if got.Runs[0].Summary != nil {
		t.Error("summary appeared from nowhere")
	}
}

// TestLoadReadsAReportSavedBeforeGzip: the results published before
// results.json.gz are plain results.json; they still render.
func TestLoadReadsAReportSavedBeforeGzip(t *testing.T) {
	r := fixture(t)
	dir := t.TempDir()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != len(r.Runs) || got.Runs[0].Audit.Ordered != 300 {
		t.Errorf("the plain results.json lost data: %+v", got)
	}
}

func TestOverlap(t *testing.T) {
	for _, c := range []struct {
		a, b []float64
		want bool
	}{
		{[]float64{250, 358, 614}, []float64{267, 333, 549}, true},
		{[]float64{858, 961, 1247}, []float64{303, 604, 665}, false},
		{[]float64{500}, []float64{400, 600}, false}, // one round says nothing about noise
	} {
		if got := overlap(c.a, c.b); got != c.want {
			t.Errorf("overlap(%v, %v) = %v", c.a, c.b, got)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{fmtInt(1234567), "1,234,567"}, {fmtInt(-45), "−45"}, {fmtInt(0), "0"},
		{fmtRate(0), "–"}, {fmtRate(83.94), "83.9"}, {fmtRate(1015.4), "1,015"},
		{fmtDur(800 * time.Microsecond), "0.8 ms"}, {fmtDur(172 * time.Millisecond), "172 ms"}, {fmtDur(1040 * time.Millisecond), "1.04 s"},
		{fmtRatio(0.4321), "0.43×"}, {fmtRatio(1.4), "1.4×"}, {fmtRatio(0.0291), "0.029×"},
		{fmtTick(0), "0"}, {fmtTick(0.1), "0.1"}, {fmtTick(1000), "1,000"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// TestRounds: speed from the median round, safety from the worst.
func TestRounds(t *testing.T) {
	clean := &Audit{Initial: 300, Available: 0, Ordered: 300, Orders: 300, Consistent: true}
	slow := summary(t, "burst-conditional.json") // 266.7 orders/s
	fast := summary(t, "burst-naive.json")       // 345 / 1.653 s = 208.7 orders/s
	r := &Report{
		Strategies: []string{"naive", "conditional"},
		Backends:   []string{"postgres"},
		Ceilings:   []Ceiling{{Backend: "postgres", Statement: "conditional", Workers: 48, PerSecond: 800}},
		Runs: []*Run{
			{Backend: "postgres", Strategy: "conditional", Scenario: Burst, Round: 1, Summary: slow, Audit: clean},
			{Backend: "postgres", Strategy: "conditional", Scenario: Burst, Round: 2, Summary: fast, Audit: &Audit{Initial: 345, Available: 0, Ordered: 345, Orders: 345}},
			{Backend: "postgres", Strategy: "conditional", Scenario: Burst, Round: 3, Summary: slow, Audit: &Audit{Initial: 300, Available: -2, Ordered: 302, Orders: 300}},
			{Backend: "postgres", Strategy: "naive", Scenario: Burst, Round: 1, Summary: slow, Audit: clean},
			{Backend: "postgres", Strategy: "naive", Scenario: Burst, Round: 2, ExitCode: 99, Summary: fast, Audit: &Audit{Initial: 300, Available: -45, Ordered: 345, Orders: 345}},
		},
	}
	rows := r.Rows(Burst)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one per strategy", len(rows))
	}
	naive, cond := rows[0], rows[1]
	if len(cond.Rounds) != 3 || len(cond.RoundsPerSec) != 3 {
		t.Fatalf("rounds: %d", len(cond.Rounds))
	}
	// Sorted by orders/s: round 2 (208.7), rounds 1 and 3 (266.7): the
	// median is round 1.
	if cond.Run.Round != 1 || !near(cond.Stats.OrdersPerSec, 300/1.125) {
		t.Errorf("median round %d at %v orders/s", cond.Run.Round, cond.Stats.OrdersPerSec)
	}
	// Round 3 oversold 2 units (and 2 buyers got 201 without a row): the
	// strategy fails although its median round is clean.
	if cond.Verdict.Status != StatusFail || cond.Verdict.Oversold != 2 || cond.Audit.Available != -2 {
		t.Errorf("verdict %+v, audit %+v", cond.Verdict, cond.Audit)
	}
	if p := strings.Join(cond.Verdict.Problems, "; "); !strings.Contains(p, "round 3: oversold 2 units") {
		t.Errorf("problems: %s", p)
	}
	if f := strings.Join(r.Failures(), "\n"); !strings.Contains(f, "postgres/conditional burst round 3: oversold 2 units") || strings.Contains(f, "round 1") {
		t.Errorf("failures:\n%s", f)
	}
	// The control oversold in one round out of two: that is what it shows.
	if naive.Verdict.Status != StatusControlOversold || naive.Verdict.Oversold != 45 || naive.Audit.Available != -45 {
		t.Errorf("naive: %+v", naive.Verdict)
	}
	var md bytes.Buffer
	r.Rounds = 3
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "267 (267 · 209 · 267)") {
		t.Errorf("the markdown table does not show every round:\n%s", md.String())
	}
}

// TestDescribeStrategy: every registered strategy (bin/stock strategies)
// has a description; the controls are the only ones marked unsafe.
func TestDescribeStrategy(t *testing.T) {
	for _, name := range strategies.Names() {
		s := DescribeStrategy(name)
		if s.Unknown || s.Name != name || s.How == "" || s.Expect == "" {
			t.Errorf("%s: %+v", name, s)
		}
		if s.Safe == IsControl(name) {
			t.Errorf("%s: Safe = %v", name, s.Safe)
		}
	}
	for _, name := range []string{"naive", "legacy-getset"} {
		if !IsControl(name) {
			t.Errorf("%s is not a control", name)
		}
	}
	for name, want := range map[string][]string{
		"etcd-lock": {"session lease", "create revision", "predecessor", "100 ms", "fence base", "minority", "raft write"},
		"zk-lock":   {"ephemeral sequential", "protected", "predecessor", "SUSPENDED", "EXPIRED", "zxid"},
		"db-lock":   {"conditional statement", "database's clock", "owner", "fencing token", "polls"},
	} {
		s := DescribeStrategy(name)
		for _, w := range want {
			if !strings.Contains(s.How+" "+s.Expect, w) {
				t.Errorf("%s's description does not mention %q", name, w)
			}
		}
	}
	if s := DescribeStrategy("quorum-lock"); !s.Unknown || !s.Safe {
		t.Errorf("unknown strategy: %+v", s)
	}
}

// TestRenderLockStrategies: etcd-lock and zk-lock get rows, descriptions
// and their servers' versions on both pages.
func TestRenderLockStrategies(t *testing.T) {
	clean := &Audit{Initial: 300, Available: 0, Ordered: 300, Orders: 300, Consistent: true}
	r := &Report{
		Title: "test", Mode: "quick",
		Started:    time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC),
		Finished:   time.Date(2026, 11, 22, 0, 2, 0, 0, time.UTC),
		Strategies: []string{"conditional", "etcd-lock", "zk-lock"},
		Backends:   []string{"postgres"},
		Env:        Environment{Cores: 2, Etcd: "etcd 3.4.23 (cluster version 3.4.0) at 127.0.0.1:40001", ZooKeeper: "ZooKeeper 3.8.0 at 127.0.0.1:40002"},
		Ceilings:   []Ceiling{{Backend: "postgres", Statement: "conditional", Workers: 48, PerSecond: 800}},
		Settings:   []Setting{{Name: "ETCD_ENDPOINTS", Value: "127.0.0.1:40001", Note: "etcd-lock: started by the demo"}},
	}
	for _, s := range r.Strategies {
		r.Runs = append(r.Runs, &Run{Backend: "postgres", Strategy: s, Scenario: Burst, Stock: 300, Buyers: 1200, VUs: 100, Instances: 3,
			Summary: summary(t, "burst-conditional.json"), Audit: clean, Dir: "runs/postgres-" + s + "/burst"})
	}
	if f := r.Failures(); len(f) != 0 {
		t.Errorf("failures: %q", f)
	}
	var html, md bytes.Buffer
	if err := WriteHTML(&html, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| PostgreSQL | etcd-lock | 267 |", "| PostgreSQL | zk-lock | 267 |",
		"**etcd-lock**: A lock on etcd v3", "**zk-lock**: ZooKeeper's lock recipe",
		"| etcd | etcd 3.4.23", "| ZooKeeper | ZooKeeper 3.8.0", "| ETCD_ENDPOINTS | `127.0.0.1:40001`",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report.md lacks %q:\n%s", want, md.String())
		}
	}
	for _, want := range []string{"<code>etcd-lock</code>", "<code>zk-lock</code>", "<td>etcd</td><td>etcd 3.4.23", "<td>ZooKeeper</td><td>ZooKeeper 3.8.0"} {
		if !strings.Contains(html.String(), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}
