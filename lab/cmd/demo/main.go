// Command demo runs the comparison behind `make demo`: for every strategy
// the service has, on PostgreSQL and on MariaDB/MySQL, it starts three
// instances, runs the k6 burst and steady scenarios (loadtest/) against
// them, audits the sale, and measures beside them the ceilings they are
// judged against (the load generator against /healthz, the database's hot
// row without the service). It writes reports/<timestamp>/index.html,
// report.md and results.json.gz, points reports/latest at them, and exits
// non-zero when a safe strategy oversold or lost an order or a run failed.
//
//	go run ./lab/cmd/demo            # what make demo runs (after make services build)
//	DEMO_QUICK=1 go run ./lab/cmd/demo
//	go run ./lab/cmd/demo render reports/latest   # re-render a report from its results.json.gz
//	go run ./lab/cmd/demo publish reports/latest docs/results/<stamp>   # what PUBLISH=1 runs
//	go run ./lab/cmd/demo choose docs/results/<stamp> > docs/choosing.md
//	go run ./lab/cmd/demo recover-k6 DIR DIR/report.md   # once, for runs saved before results.json.gz kept the k6 figures
//
// Configuration is read from the environment; see config.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		stop()
		os.Exit(1)
	}
}

// errFailed: the report was written, and it shows a failure.
var errFailed = errors.New("the demonstration found failures (see the report)")

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "render":
			if len(args) != 2 {
				return fmt.Errorf("usage: demo render REPORT_DIR")
			}
			return render(args[1])
		case "publish":
			if len(args) != 3 {
				return fmt.Errorf("usage: demo publish REPORT_DIR DEST_DIR")
			}
			return publish(args[1], args[2])
		case "choose":
			if len(args) != 2 {
				return fmt.Errorf("usage: demo choose REPORT_DIR  (writes choosing.md for docs/ on standard output)")
			}
			return choose(out, args[1])
		case "recover-k6":
			if len(args) != 3 {
				return fmt.Errorf("usage: demo recover-k6 REPORT_DIR REPORT_MD")
			}
			return recoverK6(args[1], args[2])
		default:
			return fmt.Errorf("unknown command %q: use no argument to run the demo, or render DIR, publish DIR DEST, choose DIR, recover-k6 DIR REPORT_MD", args[0])
		}
	}
	p, err := loadPlan(getenv)
	if err != nil {
		return err
	}
	if err := os.Chdir(p.Root); err != nil {
		return err
	}
	rep, dir, err := runDemo(ctx, p, out)
	if rep == nil {
		return err
	}
	printSummary(out, rep, dir, filepath.Join(p.ReportsDir, "latest"))
	if err != nil {
		return err
	}
	if len(rep.Failures()) > 0 {
		return errFailed
	}
	return nil
}

// runDemo prepares everything, runs every step, and writes the report. It
// returns the report whenever one was written, with the error that cut the
// run short, if any.
func runDemo(ctx context.Context, p plan, out io.Writer) (*report.Report, string, error) {
	started := time.Now()
	root, err := os.Getwd()
	if err != nil {
		return nil, "", err
	}
	if os.Getenv("STOCK_BIN") == "" {
		fmt.Fprintln(out, "building bin/stock")
		build := exec.CommandContext(ctx, "go", "build", "-o", p.StockBin, "./cmd/stock")
		build.Stdout, build.Stderr = out, out
		if err := build.Run(); err != nil {
			return nil, "", fmt.Errorf("building the service: %w", err)
		}
	}
	if p.StockBin, err = filepath.Abs(p.StockBin); err != nil {
		return nil, "", err
	}
	if len(p.Strategies) == 0 {
		if p.Strategies, err = strategiesOf(ctx, p.StockBin); err != nil {
			return nil, "", err
		}
	}
	p.FailoverStrategies = failoverStrategies(p)
	for _, b := range p.Backends {
		if err := ping(ctx, b); err != nil {
			return nil, "", fmt.Errorf("%s does not answer (make services sets it up): %w", b.Name, err)
		}
	}
	fmt.Fprintln(out, "resolving k6 (loadtest/go.mod pins it; the first build takes about 4 minutes)")
	loadtestDir := filepath.Join(root, "loadtest")
	k6Bin, err := resolveK6(ctx, loadtestDir)
	if err != nil {
		return nil, "", err
	}

	stamp := started.UTC().Format("20060102-150405")
	dir, err := filepath.Abs(filepath.Join(p.ReportsDir, stamp))
	if err != nil {
		return nil, "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	prog := newProgress(out, totalSteps(p))
	d := &demo{
		p: p, progress: prog, dir: dir, runID: strings.ReplaceAll(stamp, "-", ""),
		k6:          &k6Runner{bin: k6Bin, loadtestDir: loadtestDir, progress: prog},
		skus:        map[string][]string{},
		steadyRates: map[string]int{},
		pids:        map[string]pidLookup{},
		rep: &report.Report{
			Title:         "Flash sale: anti-oversell strategies under load",
			Started:       started,
			Mode:          p.mode(),
			Strategies:    p.Strategies,
			Rounds:        p.Rounds,
			BuyersPerUnit: p.buyersPerUnit(),
			Capacity:      &report.Capacity{ServiceCores: p.CapacityServiceCores, DatabaseCores: p.CapacityDatabaseCores},
		},
	}
	for _, b := range p.Backends {
		d.rep.Backends = append(d.rep.Backends, b.Name)
	}
	fmt.Fprintf(out, "strategies: %s; backends: %s; report: %s\n", strings.Join(p.Strategies, ", "), strings.Join(d.rep.Backends, ", "), dir)

	// The servers of the lock strategies: the environment's, or the demo's
	// own. A strategy whose etcd or ZooKeeper could not start is skipped,
	// with a note in the report, and the rest of the demo runs.
	stopLockServices, skipped := d.startLockServices(out)
	defer stopLockServices()
	if len(skipped) > 0 {
		isSkipped := func(s string) bool { return slices.Contains(skipped, s) }
		kept := slices.DeleteFunc(slices.Clone(p.Strategies), isSkipped)
		p.Strategies = kept
		d.p.Strategies, d.rep.Strategies = kept, kept
		p.FailoverStrategies = slices.DeleteFunc(p.FailoverStrategies, isSkipped)
		d.p.FailoverStrategies = p.FailoverStrategies
		prog.setSteps(totalSteps(p))
	}
	if d.cluster == nil && p.CatalogCluster {
		p.CatalogCluster, d.p.CatalogCluster = false, false
		prog.setSteps(totalSteps(p))
	}
	d.rep.Env = environment(ctx, p, k6Bin)
	d.rep.Env.Etcd = etcdVersion(ctx, d.etcd)
	d.rep.Env.ZooKeeper = zkVersion(d.zk)

	d.measureLoadGen(ctx)
	for _, b := range p.Backends {
		if ctx.Err() != nil {
			break
		}
		// Each round measures the ceilings and runs every strategy's
		// burst and steady run, the strategies taking turns; the steady
		// rate is fixed after the first round's ceilings, so that every
		// round offers the same load.
		for round := 1; round <= p.Rounds; round++ {
			if ctx.Err() != nil {
				break
			}
			d.measureCeilings(ctx, b, round)
			if round == 1 {
				d.steadyRates[b.Name] = d.steadyRate(b)
				prog.note("steady rate on %s: %d orders/s", b.Name, d.steadyRates[b.Name])
			}
			for _, s := range p.Strategies {
				if ctx.Err() != nil {
					break
				}
				d.runStrategy(ctx, b, s, round)
				if round == 1 && slices.Contains(lifecycleStrategies(p), s) && ctx.Err() == nil {
					d.runLifecycle(ctx, b, s)
				}
			}
			// The reserved strategies' catalog once more, spread over
			// the Redis Cluster's masters, beside its run on one Redis.
			if round == 1 {
				for _, s := range clusterCatalogs(p) {
					if ctx.Err() != nil {
						break
					}
					d.runClusterCatalog(ctx, b, s, round)
				}
			}
		}
		if ctx.Err() == nil {
			d.runRatioBursts(ctx, b)
		}
	}
	if ctx.Err() == nil {
		d.runFailover(ctx)
	}
	d.cleanUp(ctx)

	d.rep.Finished = time.Now()
	d.rep.Env.LoadAtEnd = loadAverage()
	d.rep.Settings = append(p.settings(d.steadyRates), p.lockSettings(d.lockServices)...)
	d.rep.Commands = rerunCommands(p, d.rep.Env.GitCommit)
	if !p.KeepData {
		d.rep.Notes = append(d.rep.Notes, "The sales' orders were deleted from the databases after the run (their audits are above); DEMO_KEEP_DATA=1 keeps them.")
		if n := catalogSKUsLeft(d.rep.CatalogRuns); n > 0 {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("The catalogs' SKUs that were ordered were cleaned up like the other sales (orders deleted, stock 0); the %s never ordered keep their stock rows, with their units and no order.", plural(n, "SKU", "SKUs")))
		}
	}
	if ctx.Err() != nil {
		d.rep.Notes = append(d.rep.Notes, "The run was interrupted: the report shows what was measured until then.")
	}
	faults, err := report.LoadFaults(filepath.Join(p.ReportsDir, "faults", "latest"), dir)
	if err != nil {
		d.rep.Notes = append(d.rep.Notes, "the fault suite's results could not be read: "+err.Error())
	}
	d.rep.Faults = faults
	if err := report.WriteFiles(dir, d.rep); err != nil {
		return nil, "", err
	}
	latest := filepath.Join(p.ReportsDir, "latest")
	_ = os.Remove(latest)
	if err := os.Symlink(stamp, latest); err != nil {
		d.progress.note("reports/latest: %v", err)
	}
	if ctx.Err() != nil {
		return d.rep, dir, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	return d.rep, dir, nil
}

func ping(ctx context.Context, b backend) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	db, err := store.Open(ctx, b.URL, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping(ctx)
}

// rerunCommands are the commands that reproduce the run of the code at
// commit (as the run started).
func rerunCommands(p plan, commit string) []string {
	env := []string{}
	if p.Quick {
		env = append(env, "DEMO_QUICK=1")
	}
	// Commands that run as written in a clone of the repository: the
	// report cannot know the address it was cloned from.
	checkout := "git checkout " + strings.Fields(commit + " unknown")[0]
	if strings.Contains(commit, "uncommitted") {
		checkout += "   # the run had uncommitted changes on top of it"
	}
	cmds := []string{
		"# in a clone of this repository:",
		checkout,
		strings.TrimSpace(strings.Join(env, " ")+" make demo") + "   # scripts/demo.sh: servers, builds, then go run ./lab/cmd/demo",
		"# the same, with every setting of this run spelled out:",
	}
	full := []string{
		fmt.Sprintf("DEMO_BACKENDS=%s", joinBackends(p.Backends)),
		fmt.Sprintf("DEMO_STRATEGIES=%s", strings.Join(p.Strategies, ",")),
		fmt.Sprintf("DEMO_INSTANCES=%d", p.Instances),
		fmt.Sprintf("DB_MAX_CONNS=%d", p.DBMaxConns),
		fmt.Sprintf("NAIVE_RACE_WINDOW=%s", p.NaiveRaceWindow),
		fmt.Sprintf("BURST_STOCK=%d BURST_BUYERS=%d BURST_VUS=%d BURST_MAX_DURATION=%s BURST_ROUNDS=%d", p.BurstStock, p.BurstBuyers, p.BurstVUs, p.BurstMaxDuration, p.Rounds),
		fmt.Sprintf("BURST_MIN_SECONDS=%s GO_BURST_STRATEGIES=%s", p.BurstMin, strings.Join(p.GoBurstStrategies, ",")),
		fmt.Sprintf("STEADY_DURATION=%s STEADY_MAX_VUS=%d", p.SteadyDuration, p.SteadyMaxVUs),
		fmt.Sprintf("CEILING_DURATION=%s LOADGEN_VUS=%d LOADGEN_DURATION=%s", p.CeilingDuration, p.LoadGenVUs, p.LoadGenDuration),
		fmt.Sprintf("CAPACITY_SERVICE_CORES=%d CAPACITY_DATABASE_CORES=%d", p.CapacityServiceCores, p.CapacityDatabaseCores),
	}
	full = append(full, fmt.Sprintf("SOLD_OUT_ORDERS=%d", p.SoldOutOrders), p.ratioVars(), p.catalogVars(), p.lifecycleVars(), p.failoverVars())
	if p.SteadyRate > 0 {
		full = append(full, fmt.Sprintf("STEADY_RATE=%d", p.SteadyRate))
	}
	if p.OrderTimeout != "" {
		full = append(full, "ORDER_TIMEOUT="+p.OrderTimeout)
	}
	if p.LockTTL != "" {
		full = append(full, "LOCK_TTL="+p.LockTTL)
	}
	// Servers the demo's environment named; without them the demo starts
	// its own again.
	for _, v := range []struct {
		name  string
		addrs []string
	}{{"REDIS_ADDRS", p.RedisAddrs}, {"ETCD_ENDPOINTS", p.EtcdEndpoints}, {"ZK_SERVERS", p.ZKServers}} {
		if len(v.addrs) > 0 {
			full = append(full, v.name+"="+strings.Join(v.addrs, ","))
		}
	}
	cmds = append(cmds, strings.Join(full, " \\\n  ")+" \\\n  go run ./lab/cmd/demo")
	cmds = append(cmds, "# one scenario by hand: start the instances and run the k6 command listed under its run below")
	return cmds
}

func joinBackends(bs []backend) string {
	var names []string
	for _, b := range bs {
		names = append(names, b.Name)
	}
	return strings.Join(names, ",")
}

// printSummary prints the verdicts and main figures on the terminal.
func printSummary(out io.Writer, rep *report.Report, dir, latest string) {
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "backend\tstrategy\tscenario\torders/s\tp99\toversold\t× ceiling\tverdict\t")
	for _, sc := range []string{report.Burst, report.Steady} {
		for _, row := range rep.Rows(sc) {
			oversold, ratio, p99 := "–", "–", "–"
			if row.Run.Audit != nil {
				oversold = fmt.Sprint(row.Verdict.Oversold)
			}
			if row.HasRatio {
				ratio = fmt.Sprintf("%.2f×", row.Ratio)
			}
			if row.Stats.HasLatency {
				p99 = row.Stats.P99.Round(time.Millisecond).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t\n", row.Run.Backend, row.Run.Strategy, sc,
				row.Stats.OrdersPerSec, p99, oversold, ratio, report.StatusText(row.Verdict))
		}
	}
	tw.Flush()
	if cats := rep.Catalogs(); len(cats) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "backend\tcatalog\tSKUs\tset-up\torders/s\tp99\tSKUs exact\tworst SKU\tverdict")
		for _, c := range cats {
			worst := "none"
			if c.Worst != nil {
				worst = fmt.Sprintf("%s (rank %d): %d oversold, initial %d, available %d, ordered %d",
					c.Worst.SKU, c.Worst.Rank+1, c.Worst.Oversold(), c.Worst.Audit.Initial, c.Worst.Audit.Available, c.Worst.Audit.Ordered)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1fs\t%.0f\t%s\t%d/%d\t%s\t%s\n", c.Backend, c.Label(), c.SKUs, c.Setup.Seconds(),
				c.OrdersPerSec, c.P99.Round(time.Millisecond), c.Exact, c.Audited, worst, report.StatusText(c.Judge()))
		}
		tw.Flush()
	}
	if lcs := rep.Lifecycles(); len(lcs) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "backend\tlifecycle\tpaid\treturned\tresold\texpiry → resale p50\tlimit refusals\tconsistent\tburst on ÷ off\tverdict")
		for _, l := range lcs {
			v := l.Judge()
			if l.Unsupported != "" || l.Audit == nil {
				fmt.Fprintf(tw, "%s\t%s\t–\t–\t–\t–\t–\t–\t–\t%s\n", l.Backend, l.Strategy, report.StatusText(v))
				continue
			}
			expiry, ratio := "–", "–"
			if l.Resale != nil && l.Resale.Expired > 0 {
				expiry = l.Resale.ExpiryP50.Round(time.Millisecond).String()
			}
			if l.Burst != nil && l.BurstOff != nil && l.BurstOff.OrdersPerSec > 0 && l.Burst.OrdersPerSec > 0 {
				ratio = fmt.Sprintf("%.2f×", l.Burst.OrdersPerSec/l.BurstOff.OrdersPerSec)
			}
			a := l.Audit
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d\t%d\t%s\t%d/%d\t%v\t%s\t%s\n", l.Backend, l.Strategy, a.Paid, a.Initial+a.Restocked,
				a.Returned, l.Resold(), expiry, l.LimitReached, l.SecondOrders, a.Consistent, ratio, report.StatusText(v))
		}
		tw.Flush()
	}
	for _, f := range rep.Failures() {
		fmt.Fprintf(out, "FAILURE: %s\n", f)
	}
	fmt.Fprintf(out, "\nreport: %s/index.html (and report.md); %s points at it\n", dir, latest)
}
