package report

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// burstOf is a burst of 1,000 units on one strategy, sold at perSec, whose
// audit and k6 figures agree: a clean run.
func burstOf(backend, strategy string, round int, perSec float64) *Run {
	return &Run{
		Backend: backend, Strategy: strategy, Scenario: Burst, Round: round, Stock: 1000, Buyers: 4000, VUs: 200, Instances: 3,
		Audit: &Audit{Initial: 1000, Ordered: 1000, Orders: 1000, Consistent: true},
		K6: &K6Figures{Stats: Stats{
			Requests: 4000, Orders: 1000, SoldOut: 3000, OrdersPerSec: perSec, RequestsPerSec: 4 * perSec,
			SellWindow: time.Duration(1000 / perSec * float64(time.Second)), AnswerWindow: time.Duration(1000 / perSec * float64(time.Second)),
			HasLatency: true, P50: 10 * time.Millisecond, P95: 50 * time.Millisecond, P99: 80 * time.Millisecond,
		}},
	}
}

// steadyOf is a steady run that served every order offered, with p99.
func steadyOf(backend, strategy string, p99 time.Duration) *Run {
	r := burstOf(backend, strategy, 1, 400)
	r.Scenario, r.Rate = Steady, 400
	r.K6.P99 = p99
	return r
}

func reportOf(runs ...*Run) *Report {
	r := &Report{Backends: []string{"postgres"}, Rounds: 1}
	for _, run := range runs {
		if !slices.Contains(r.Strategies, run.Strategy) {
			r.Strategies = append(r.Strategies, run.Strategy)
		}
		r.Rounds = max(r.Rounds, run.Round)
	}
	r.Runs = runs
	return r
}

// choice returns the situation whose name starts with prefix.
func choice(t *testing.T, r *Report, prefix string) Choice {
	t.Helper()
	for _, c := range r.Choices() {
		if strings.HasPrefix(c.Situation, prefix) {
			return c
		}
	}
	t.Fatalf("no situation %q in %+v", prefix, r.Choices())
	return Choice{}
}

func names(ps []Pick) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Strategy)
	}
	return out
}

func TestChoiceWithinTheNoiseSaysEither(t *testing.T) {
	r := reportOf(
		burstOf("postgres", "conditional", 1, 1000),
		burstOf("postgres", "batched", 1, 1080), // within 10% of each other
		burstOf("postgres", "for-update", 1, 300),
	)
	cell := choice(t, r, "One hot SKU, final orders; database only").Cells[0]
	if got := names(cell.Use); !slices.Equal(got, []string{"batched", "conditional"}) {
		t.Errorf("use %q, want either batched or conditional (8%% apart)", got)
	}
	if got := names(cell.Avoid); !slices.Equal(got, []string{"for-update"}) || cell.Avoid[0].Apart != "3.6× slower" {
		t.Errorf("avoid %+v, want for-update, 3.6× slower", cell.Avoid)
	}
	var md strings.Builder
	if err := WriteChoosing(&md, r, "index.html", ""); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "use either **batched** (1,080 orders/s) or **conditional** (1,000 orders/s)") {
		t.Errorf("choosing.md does not say either:\n%s", md.String())
	}
}

func TestChoiceWithOverlappingRoundsIsATie(t *testing.T) {
	// 1,300 against 1,150 (median rounds) is more than 10% apart, but
	// batched's rounds (1,000–1,400) cover conditional's (1,100–1,200):
	// the run's own spread.
	overlapping := reportOf(
		burstOf("postgres", "batched", 1, 1000), burstOf("postgres", "batched", 2, 1400), burstOf("postgres", "batched", 3, 1300),
		burstOf("postgres", "conditional", 1, 1100), burstOf("postgres", "conditional", 2, 1200), burstOf("postgres", "conditional", 3, 1150),
	)
	if got := names(choice(t, overlapping, "One hot SKU, final orders; database only").Cells[0].Use); len(got) != 2 {
		t.Errorf("use %q, want both: their rounds overlap", got)
	}
	apart := reportOf(
		burstOf("postgres", "batched", 1, 1280), burstOf("postgres", "batched", 2, 1400), burstOf("postgres", "batched", 3, 1300),
		burstOf("postgres", "conditional", 1, 1100), burstOf("postgres", "conditional", 2, 1200), burstOf("postgres", "conditional", 3, 1150),
	)
	if got := names(choice(t, apart, "One hot SKU, final orders; database only").Cells[0].Use); !slices.Equal(got, []string{"batched"}) {
		t.Errorf("use %q, want batched alone: its slowest round beats conditional's fastest", got)
	}
}

func TestChoiceNeverRecommendsAControl(t *testing.T) {
	r := reportOf(burstOf("postgres", "naive", 1, 5000), burstOf("postgres", "conditional", 1, 1000))
	cell := choice(t, r, "One hot SKU, final orders; database only").Cells[0]
	if got := names(cell.Use); !slices.Equal(got, []string{"conditional"}) {
		t.Errorf("use %q, want conditional: naive is a control", got)
	}
	if slices.Contains(names(cell.Avoid), "naive") {
		t.Errorf("a control is among the speed's candidates: %+v", cell.Avoid)
	}
}

func TestChoiceAvoidsAStrategyThatFailedTheAudit(t *testing.T) {
	oversold := burstOf("postgres", "version-cas", 1, 2000)
	oversold.Audit.Ordered, oversold.Audit.Available = 1001, -1
	r := reportOf(oversold, burstOf("postgres", "conditional", 1, 1000), burstOf("postgres", "for-update", 1, 500))
	cell := choice(t, r, "One hot SKU, final orders; database only").Cells[0]
	if got := names(cell.Use); !slices.Equal(got, []string{"conditional"}) {
		t.Errorf("use %q, want conditional: the faster version-cas oversold", got)
	}
	if len(cell.Avoid) != 1 || cell.Avoid[0].Strategy != "version-cas" || !strings.Contains(cell.Avoid[0].Figure, "failed the audit: oversold 1 units") {
		t.Errorf("avoid %+v, want version-cas, which failed the audit", cell.Avoid)
	}
}

func TestChoiceKeepsDatabaseOnlyApartFromRedis(t *testing.T) {
	r := reportOf(burstOf("postgres", "redis-reserve", 1, 3000), burstOf("postgres", "conditional", 1, 1000), burstOf("postgres", "etcd-lock", 1, 4000))
	if got := names(choice(t, r, "One hot SKU, final orders; database only").Cells[0].Use); !slices.Equal(got, []string{"conditional"}) {
		t.Errorf("database only: use %q, want conditional (redis-reserve needs Redis, etcd-lock etcd)", got)
	}
	if got := names(choice(t, r, "One hot SKU, final orders; Redis too").Cells[0].Use); !slices.Equal(got, []string{"redis-reserve"}) {
		t.Errorf("Redis too: use %q, want redis-reserve (etcd-lock needs etcd)", got)
	}
}

func TestChoiceSaysWhatTheRunDidNotMeasure(t *testing.T) {
	// A quick run of two strategies: no catalog, no lifecycle, no steady
	// run, no fault suite.
	r := reportOf(burstOf("postgres", "conditional", 1, 1000), burstOf("postgres", "naive", 1, 2000))
	r.Mode = "quick"
	for prefix, want := range map[string]string{
		"A catalog of many SKUs; database only": "not measured in this run (no catalog: CATALOG_SKUS=0)",
		"Orders that come back":                 "not measured in this run (LIFECYCLE=0)",
		"A latency budget":                      "not measured in this run",
		"Survive a database kill":               "not measured: no fault-suite results beside this run (make faults)",
	} {
		cell := choice(t, r, prefix).Cells[0]
		if cell.Missing != want || len(cell.Use) > 0 {
			t.Errorf("%s: %+v, want %q and no pick", prefix, cell, want)
		}
	}
	if !slices.Contains(r.NotInRun(), "batched") || slices.Contains(r.NotInRun(), "conditional") || slices.Contains(r.NotInRun(), "naive") {
		t.Errorf("not in the run: %q, want the safe strategies left out", r.NotInRun())
	}
	var md strings.Builder
	if err := WriteChoosing(&md, r, "index.html", ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Not in this run, so in no row: " + strings.Join(r.NotInRun(), ", "), "for-update, version-cas", "A quick run"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("choosing.md lacks %q:\n%s", want, md.String())
		}
	}
}

func TestChoiceOfLatencyTakesTheLowestP99(t *testing.T) {
	r := reportOf(steadyOf("postgres", "conditional", 100*time.Millisecond), steadyOf("postgres", "batched", 40*time.Millisecond),
		steadyOf("postgres", "redis-lock", 900*time.Millisecond))
	cell := choice(t, r, "A latency budget").Cells[0]
	if got := names(cell.Use); !slices.Equal(got, []string{"batched"}) || cell.Use[0].Figure != "p99 40 ms at 400/s" {
		t.Errorf("use %+v, want batched, p99 40 ms at 400/s", cell.Use)
	}
	if got := names(cell.Avoid); !slices.Equal(got, []string{"redis-lock"}) || cell.Avoid[0].Apart != "22× higher" {
		t.Errorf("avoid %+v, want redis-lock, 22× higher", cell.Avoid)
	}
}

func TestChoiceOfFaultsTakesTheSurvivors(t *testing.T) {
	r := reportOf(burstOf("postgres", "redis-lock", 1, 300), burstOf("postgres", "etcd-lock", 1, 280),
		burstOf("postgres", "redis-reserve", 1, 2000), burstOf("postgres", "redis-watch", 1, 250))
	r.Faults = &Faults{Verdict: "ok", Runs: []FaultRun{
		{Name: "2-paused-holder/redis-lock/fencing-on", Verdict: "ok"},
		{Name: "2-paused-holder/redis-lock/fencing-off", Verdict: "expected-oversell"},
		{Name: "7-paused-holder/etcd-lock/fencing-on", Verdict: "ok"},
		{Name: "2-paused-holder/legacy-getset/fencing-off", Verdict: "expected-oversell"},
		{Name: "8-reserve-redis-restart/postgres/redis-reserve", Verdict: "ok"},
		{Name: "9-catalog-redis-restart/postgres/redis-reserve", Verdict: "degraded"},
		{Name: "8-reserve-redis-restart/postgres/redis-watch", Verdict: "ok"},
	}}
	paused := choice(t, r, "Survive an instance paused").Cells[0]
	if got := names(paused.Use); !slices.Equal(got, []string{"redis-lock", "etcd-lock"}) {
		t.Errorf("paused instance: use %q, want either redis-lock or etcd-lock (300 and 280 orders/s)", got)
	}
	if got := names(paused.Avoid); !slices.Equal(got, []string{"FENCING=off", "legacy-getset"}) || !strings.Contains(paused.Avoid[0].Figure, "redis-lock") {
		t.Errorf("paused instance: avoid %+v, want FENCING=off (redis-lock) and legacy-getset", paused.Avoid)
	}
	restart := choice(t, r, "Survive a Redis restart").Cells[0]
	if got := names(restart.Use); !slices.Equal(got, []string{"redis-watch"}) {
		t.Errorf("Redis restart: use %q, want redis-watch: redis-reserve was degraded once", got)
	}
	if got := names(restart.Avoid); !slices.Equal(got, []string{"redis-reserve"}) || !strings.Contains(restart.Avoid[0].Figure, "degraded in 9-catalog-redis-restart") {
		t.Errorf("Redis restart: avoid %+v, want redis-reserve, degraded", restart.Avoid)
	}
	if lost := choice(t, r, "Survive a lost lock server").Cells[0]; lost.Missing != "not measured: the fault suite has no run of this fault" {
		t.Errorf("lost lock server: %+v, want not measured", lost)
	}
}

// TestChoiceOfFaultsListsEverySurvivor: surviving a fault is the property,
// not a speed: every strategy that came through every run of it is one to
// use, the fastest first, however far apart their bursts (the summary
// once named only the fastest survivor of a database kill, as if the
// others had not survived it).
func TestChoiceOfFaultsListsEverySurvivor(t *testing.T) {
	r := reportOf(burstOf("postgres", "batched", 1, 2900), burstOf("postgres", "redis-reserve", 1, 2500),
		burstOf("postgres", "conditional", 1, 460))
	r.Faults = &Faults{Verdict: "ok", Runs: []FaultRun{
		{Name: "5-database-restart/postgres/conditional", Verdict: "ok"},
		{Name: "8-reserve-database-down/postgres/redis-reserve", Verdict: "ok"},
		{Name: "9-catalog-database-kill/postgres/batched", Verdict: "ok"},
	}}
	kill := choice(t, r, "Survive a database kill")
	if got := names(kill.Cells[0].Use); !slices.Equal(got, []string{"batched", "redis-reserve", "conditional"}) {
		t.Errorf("database kill: use %q, want every survivor, fastest first", got)
	}
	if got := kill.Short(); got != "either batched, redis-reserve or conditional on every engine" {
		t.Errorf("the summary: %q", got)
	}
}

func TestSavedReportRendersWithoutItsRunsFolders(t *testing.T) {
	// The summaries are in the runs' folders, which a published copy does
	// not have: results.json.gz alone must give the same figures.
	r := fixture(t)
	dir := t.TempDir()
	if err := r.Save(dir); err != nil {
		t.Fatal(err)
	}
	back, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i, run := range r.Runs {
		if back.Runs[i].Summary != nil {
			t.Fatalf("run %d has a summary: the folder has none", i)
		}
		if got, want := back.Runs[i].Stats(), run.Stats(); got != want {
			t.Errorf("run %s/%s %s: %+v, want %+v", run.Backend, run.Strategy, run.Scenario, got, want)
		}
		if got, want := back.Runs[i].Judge().Status, run.Judge().Status; got != want {
			t.Errorf("run %s/%s %s judged %s, want %s", run.Backend, run.Strategy, run.Scenario, got, want)
		}
	}
}

func TestPagesLinkOnlyTheFilesBesideThem(t *testing.T) {
	// The fixture's runs name folders (runs/…) that this folder lacks, as
	// a published copy lacks them.
	r := fixture(t)
	dir := t.TempDir()
	if err := WriteFiles(dir, r); err != nil {
		t.Fatal(err)
	}
	for name, linkTo := range map[string]func(string) string{
		"index.html": func(f string) string { return `href="` + f },
		"report.md":  func(f string) string { return "](" + f },
	} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		for _, dead := range []string{"runs/", "loadgen/", "results.json)", `results.json"`} {
			if strings.Contains(string(b), linkTo(dead)) {
				t.Errorf("%s links %q, which is not beside it", name, dead)
			}
		}
		if !strings.Contains(string(b), linkTo("choosing.md")) {
			t.Errorf("%s does not link choosing.md, written beside it", name)
		}
	}
}

func TestRerunCommandsRunAsWritten(t *testing.T) {
	r := &Report{Commands: []string{"git clone <this repository> && cd stock && git checkout d6a0756", "make demo"}}
	got := rerunCommands(r)
	want := []string{"# in a clone of this repository:", "git checkout d6a0756", "make demo"}
	if !slices.Equal(got, want) {
		t.Errorf("commands %q, want %q", got, want)
	}
}
