package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/flashsale/stock/lab/faults"
)

// failoverRun is a fault-suite run of the failover scenarios as the demo
// keeps it.
func failoverRun(scenario int, name string, safe bool, verdict faults.Verdict, lost int) faults.Result {
	recovery := 9.5
	return faults.Result{Scenario: scenario, Name: name, Verdict: verdict,
		Config:  faults.Config{Engine: "postgres", Strategy: "conditional", Safe: safe},
		Figures: faults.Figures{Created: 2000, LostOrders: lost, RecoverySeconds: &recovery},
		Phases:  []faults.Phase{{Name: "primary"}, {Name: "primary lost", Figures: faults.Figures{Responses503: 40, NoAnswer: 3}}}}
}

// A failover run fails the report when a safe run failed or a control was
// not caught; a degraded run (sold again late, nothing lost) is shown in
// bold and is not a failure, as in the fault suite.
func TestAFailoverControlThatIsNotCaughtIsAFailureAndACaughtOneIsNot(t *testing.T) {
	r := fixture(t)
	r.Failover = &Failover{Faults: []faults.Result{
		failoverRun(15, "15-patroni-primary-killed/postgres/conditional", true, faults.VerdictOK, 0),
		failoverRun(15, "15-patroni-async-lagging/postgres/conditional", false, faults.VerdictExpectedOversell, 75),
		failoverRun(16, "16-galera-node-kill/mysql/batched", true, faults.VerdictFailed, 2),
		failoverRun(14, "14-redis-failover-no-wait/postgres/redis-reserve", false, faults.VerdictOK, 0),
		failoverRun(14, "14-redis-failover/postgres/redis-reserve", true, faults.VerdictDegraded, 0),
	}}
	var failures []string
	for _, f := range r.Failures() {
		if strings.Contains(f, "failover ") {
			failures = append(failures, f)
		}
	}
	if len(failures) != 2 || !strings.Contains(failures[0], "16-galera-node-kill") || !strings.Contains(failures[1], "not caught") {
		t.Errorf("failures: %q; want the failed Galera run and the control that was not caught", failures)
	}
	rows := failoverFaultRows(r)
	want := []struct {
		verdict string
		bad     bool
	}{{"ok", false}, {"caught", false}, {"failed", true}, {"ok", true}, {"degraded", true}}
	for i, w := range want {
		if rows[i].Verdict != w.verdict || rows[i].Bad != w.bad {
			t.Errorf("row %d (%s): verdict %q bad %v, want %q %v", i, rows[i].Name, rows[i].Verdict, rows[i].Bad, w.verdict, w.bad)
		}
	}
	if rows[0].FirstAfter != "9.5 s" || rows[0].Between != "40 503 · 3 no answer (primary lost)" {
		t.Errorf("the first row's recovery: %q, %q", rows[0].FirstAfter, rows[0].Between)
	}
}

// replicatedBurst is one side of a round of the replication comparison.
func replicatedBurst(strategy string, round int, perSec float64) GoBurst {
	g := ratioBurst(strategy, round, perSec)
	g.Cost.Sold = g.Orders
	return g
}

func TestReplicationCostIsTheMedianOfTheRoundsAndItsGoalAppliesToBatchedAndRedisReserve(t *testing.T) {
	r := fixture(t)
	r.Failover = &Failover{Replication: []*Replication{
		{Backend: "postgres", Cluster: ClusterPatroni, Setup: "Patroni", Strategy: "batched",
			Single:     []GoBurst{replicatedBurst("batched", 1, 4000), replicatedBurst("batched", 2, 4000), replicatedBurst("batched", 3, 5000)},
			Replicated: []GoBurst{replicatedBurst("batched", 1, 2000), replicatedBurst("batched", 2, 3000), replicatedBurst("batched", 3, 2000)}},
		{Backend: "postgres", Cluster: ClusterPatroni, Setup: "Patroni", Strategy: "conditional",
			Single:     []GoBurst{replicatedBurst("conditional", 1, 500)},
			Replicated: []GoBurst{replicatedBurst("conditional", 1, 450)}},
		{Backend: "postgres", Cluster: ClusterSentinel, Setup: "Sentinel", Strategy: "redis-reserve",
			Single:     []GoBurst{replicatedBurst("redis-reserve", 1, 4000)},
			Replicated: []GoBurst{replicatedBurst("redis-reserve", 1, 3000)}},
	}}
	rows := replicationRows(r)
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3", len(rows))
	}
	// batched: 0.5×, 0.75×, 0.4×: the median, 0.5×, is under the goal.
	if rows[0].Ratio != "0.5× (0.5× · 0.75× · 0.4×)" || rows[0].Met != "no" {
		t.Errorf("batched: ratio %q, met %q", rows[0].Ratio, rows[0].Met)
	}
	if rows[1].Met != "" || rows[1].Ratio != "0.9×" {
		t.Errorf("conditional, which the goal does not name: ratio %q, met %q", rows[1].Ratio, rows[1].Met)
	}
	if rows[2].Met != "yes" || rows[2].Ratio != "0.75×" {
		t.Errorf("redis-reserve on Sentinel: ratio %q, met %q", rows[2].Ratio, rows[2].Met)
	}
	if rows[0].ServiceSingle != "180 µs" {
		t.Errorf("batched's service CPU per 201 on the single server: %q", rows[0].ServiceSingle)
	}
	var md, page bytes.Buffer
	if err := WriteMarkdown(&md, r, nil); err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(&page, r, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), `id="failover"`) {
		t.Error("index.html has no failover section")
	}
	if !strings.Contains(md.String(), "## Failover: replicated servers, and a primary lost mid-sale") ||
		!strings.Contains(md.String(), "| batched | 4,000 (4,000 · 4,000 · 5,000) | 2,000 (2,000 · 3,000 · 2,000) | 0.5× (0.5× · 0.75× · 0.4×) | **no** |") {
		t.Errorf("report.md's failover section:\n%s", md.String())
	}
}

func TestTheRecommendationForAReplicatedDatabaseIsItsFastestAndAvoidsAFailedFailover(t *testing.T) {
	r := fixture(t)
	pair := func(strategy string, single, replicated float64) *Replication {
		return &Replication{Backend: "postgres", Cluster: ClusterPatroni, Setup: "Patroni", Strategy: strategy,
			Single: []GoBurst{replicatedBurst(strategy, 1, single)}, Replicated: []GoBurst{replicatedBurst(strategy, 1, replicated)}}
	}
	killed := failoverRun(15, "15-patroni-kill/postgres/db-lock", true, faults.VerdictFailed, 3)
	killed.Config.Strategy = "db-lock"
	r.Failover = &Failover{
		Replication: []*Replication{pair("batched", 4000, 3000), pair("conditional", 500, 450), pair("db-lock", 450, 400)},
		Faults:      []faults.Result{killed},
	}
	var row *Choice
	for _, c := range r.Choices() {
		if c.Situation == "A replicated database (Patroni, Galera)" {
			row = &c
		}
	}
	if row == nil {
		t.Fatal("no recommendation for a replicated database")
	}
	var cell *ChoiceCell
	for i := range row.Cells {
		if row.Cells[i].Backend == r.BackendLabel("postgres") {
			cell = &row.Cells[i]
		}
	}
	if cell == nil || len(cell.Use) != 1 || cell.Use[0].Strategy != "batched" || cell.Use[0].Figure != "3,000 orders/s, 0.75× of one server" {
		t.Errorf("PostgreSQL's pick: %+v, want batched at 3,000 orders/s, 0.75× of one server", cell)
	}
	if cell == nil || len(cell.Avoid) != 1 || cell.Avoid[0].Strategy != "db-lock" || !strings.Contains(cell.Avoid[0].Figure, "15-patroni-kill") {
		t.Errorf("PostgreSQL's strategy to avoid: %+v, want db-lock for its failed failover", cell)
	}
}

func TestTheHeadlineSaysWhatTheFailoversLostAndWhetherTheControlsWereCaught(t *testing.T) {
	r := fixture(t)
	r.Failover = &Failover{Faults: []faults.Result{
		failoverRun(15, "15-patroni-kill/postgres/conditional", true, faults.VerdictOK, 0),
		failoverRun(15, "15-patroni-async/postgres/conditional", false, faults.VerdictExpectedOversell, 75),
	}}
	if h := failoverHeadline(r); h != " On replicated servers, all 1 runs that lost a primary or a node mid-sale lost no order answered 201 and oversold nothing; 1 of 1 controls were caught losing or overselling." {
		t.Errorf("headline: %q", h)
	}
	r.Failover.Faults = append(r.Failover.Faults, failoverRun(16, "16-galera-node-kill/mysql/batched", true, faults.VerdictFailed, 2))
	if h := failoverHeadline(r); !strings.Contains(h, "1 of 2 runs that lost a primary") {
		t.Errorf("headline with a failed run: %q", h)
	}
}
