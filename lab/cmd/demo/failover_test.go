package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/lab/report"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testgalera"
	"github.com/flashsale/stock/lab/testpatroni"
	"github.com/flashsale/stock/lab/testproc"
)

// TestTheFailoverSectionMeasuresAStrategyOnTheSingleServerAndOnItsReplicatedForm
// runs the section's comparison in miniature, for real: conditional on
// three instances on the test server and on three on PostgreSQL under
// Patroni (then MariaDB Galera, an instance per node, and every instance
// through one node), one round each. Both bursts must sell exactly their
// stock, be audited, and have the replicated servers' CPU read; the report
// must show the row.
func TestTheFailoverSectionMeasuresAStrategyOnTheSingleServerAndOnItsReplicatedForm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the service, Patroni and Galera")
	}
	root := repoRoot(t)
	stockBin := filepath.Join(t.TempDir(), "stock")
	build := exec.Command("go", "build", "-o", stockBin, "./cmd/stock")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the service: %v\n%s", err, out)
	}
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			b := backend{Name: engine, URL: testdb.URL(t, engine)}
			p := plan{
				Instances: 3, DBMaxConns: 8, AdminToken: "failover-admin-token",
				BurstStock: 60, BurstBuyers: 180, BurstVUs: 30, BurstMaxDuration: 20 * time.Second,
				Backends: []backend{b}, StockBin: stockBin,
				Failover: true, FailoverStrategies: []string{"conditional"}, FailoverRounds: 1,
			}
			dir := t.TempDir()
			var out syncBuffer
			d := &demo{p: p, progress: newProgress(&out, failoverSteps(p)), dir: dir, runID: "failover",
				skus: map[string][]string{}, rep: &report.Report{Title: "failover", Backends: []string{engine}, Mode: "test"}}
			d.rep.Failover = &report.Failover{}
			d.runReplicated(t.Context(), b, p.FailoverStrategies, filepath.Join(dir, "failover", engine), func() (*replicatedSide, error) {
				side, err := startReplicatedDB(t.Context(), b, filepath.Join(dir, "failover", engine))
				testproc.Require(t, err, map[string]error{"postgres": testpatroni.ErrNoPatroni, "mysql": testgalera.ErrNoGalera}[engine])
				return side, nil
			})
			t.Logf("runner output:\n%s", out.String())
			if errs := d.rep.Failover.Errors; len(errs) > 0 {
				t.Fatalf("the section could not run: %q", errs)
			}
			// Galera runs conditional twice: an instance writing through
			// each node, and every instance through the first.
			clusters := map[string][]string{"postgres": {report.ClusterPatroni}, "mysql": {report.ClusterGalera, report.ClusterGaleraOneWriter}}[engine]
			if n := len(d.rep.Failover.Replication); n != len(clusters) {
				t.Fatalf("%d comparisons, want %d", n, len(clusters))
			}
			for i, x := range d.rep.Failover.Replication {
				if x.Cluster != clusters[i] || x.Error != "" || len(x.Single) != 1 || len(x.Replicated) != 1 {
					t.Fatalf("conditional's comparison %d: %+v, want one round on %s", i, x, clusters[i])
				}
				for _, g := range []report.GoBurst{x.Single[0], x.Replicated[0]} {
					// Every buyer answered; on Galera a few may be turned
					// away busy (a hot row's certification conflicts
					// outlast the retries: docs/strategies.md), never sold
					// twice.
					if g.Orders != 60 || g.Orders+g.SoldOut+g.Other != 180 || len(g.Problems()) > 0 || g.Audit == nil || g.Audit.Ordered != 60 || g.Audit.Available != 0 {
						t.Errorf("%s: a burst sold %d of 60 (%d sold out, %d other): %q, audit %+v", x.Cluster, g.Orders, g.SoldOut, g.Other, g.Problems(), g.Audit)
					}
				}
				// The replicated side's database CPU is read from its own
				// servers: every member or node, not the test server.
				var db *report.ComponentCost
				for i, c := range x.Replicated[0].Cost.Components {
					if c.Name == report.ComponentDatabase {
						db = &x.Replicated[0].Cost.Components[i]
					}
				}
				want := map[string]int{"postgres": 2, "mysql": 3}[engine]
				if db == nil || !db.Measured() || db.Processes != want {
					t.Errorf("%s: the replicated side's database CPU: %+v, want %d servers read", x.Cluster, db, want)
				}
			}
			if f := d.rep.Failures(); len(f) > 0 {
				t.Errorf("failures: %q", f)
			}
			if err := report.WriteFiles(dir, d.rep); err != nil {
				t.Fatal(err)
			}
			page, err := os.ReadFile(filepath.Join(dir, "report.md"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(page), "What replication costs") || !strings.Contains(string(page), "| conditional |") {
				t.Errorf("report.md has no failover row:\n%s", page)
			}
		})
	}
}
