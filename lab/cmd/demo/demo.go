package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/hotrow"
	"github.com/flashsale/stock/lab/report"
)

// demo runs one comparison: it owns the processes it starts and the report
// it fills.
type demo struct {
	p        plan
	k6       *k6Runner
	progress *progress
	// dir is the report's directory; runID makes the SKUs unique.
	dir   string
	runID string
	rep   *report.Report
	redis []string
	// reserveRedis is redis-reserve's and redis-watch's durable Redis;
	// cluster the masters of the Redis Cluster of their second catalog
	// run, nil when there is none.
	reserveRedis []string
	cluster      []string
	// etcd and zk are ETCD_ENDPOINTS and ZK_SERVERS for etcd-lock and
	// zk-lock: the environment's, or the servers the demo started.
	etcd []string
	zk   []string
	// lockServices are the servers of the lock strategies, for the report.
	lockServices []lockService
	// skus are the sales started, per backend, for the clean-up.
	skus map[string][]string
	// steadyRates is the rate offered per backend.
	steadyRates map[string]int
	// pids are the servers' processes by address, looked up once (the
	// steps run one at a time, so the map needs no lock).
	pids map[string]pidLookup
}

// strategiesOf asks the service binary which strategies it has.
func strategiesOf(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, bin, "strategies").Output()
	if err != nil {
		return nil, fmt.Errorf("%s strategies: %w", bin, err)
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		return nil, fmt.Errorf("%s strategies printed nothing", bin)
	}
	return names, nil
}

// totalSteps counts the progress steps of a plan.
func totalSteps(p plan) int {
	return 1 + len(p.Backends)*max(1, p.Rounds)*(1+len(p.Strategies)) + len(p.Backends)*(len(clusterCatalogs(p))+len(lifecycleStrategies(p))+ratioSteps(p)) +
		failoverSteps(p)
}

// ratioSteps is 1 when the plan runs the ratio burst (a step per backend).
func ratioSteps(p plan) int {
	if p.RatioRounds == 0 {
		return 0
	}
	for _, s := range ratioStrategies {
		if !slices.Contains(p.Strategies, s) {
			return 0
		}
	}
	return 1
}

// clusterCatalogs are the strategies whose catalog runs a second time, on
// the Redis Cluster.
func clusterCatalogs(p plan) []string {
	if p.CatalogSKUs == 0 || !p.CatalogCluster {
		return nil
	}
	var out []string
	for _, s := range p.Strategies {
		if isReserved(s) {
			out = append(out, s)
		}
	}
	return out
}

// measureLoadGen measures the load generator's ceiling: k6 against /healthz
// on instances of the first backend.
func (d *demo) measureLoadGen(ctx context.Context) {
	d.progress.begin("load generator ceiling: k6 → GET /healthz, %d VUs for %s", d.p.LoadGenVUs, d.p.LoadGenDuration)
	lg := &report.LoadGen{VUs: d.p.LoadGenVUs, Duration: d.p.LoadGenDuration, Dir: "loadgen"}
	d.rep.LoadGen = lg
	runDir := filepath.Join(d.dir, lg.Dir)
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		lg.Error = err.Error()
		return
	}
	b := d.p.Backends[0]
	strategy := "conditional"
	if len(d.p.Strategies) > 0 && !slices.Contains(d.p.Strategies, strategy) {
		strategy = d.p.Strategies[0]
	}
	f, err := startFleet(ctx, d.p.StockBin, d.p.Instances, d.serviceEnv(b, strategy), runDir)
	if err != nil {
		lg.Error = err.Error()
		return
	}
	defer f.stop()
	// The service's CPU per request and k6's: the database has nothing
	// to do for /healthz.
	healthzMeter := &cpuMeter{components: []component{serviceComponent(f)}}
	res := d.k6.run(ctx, k6Job{
		Meter:  healthzMeter,
		Label:  "healthz",
		Script: "healthz.js",
		Vars: [][2]string{
			{"BASE_URLS", strings.Join(f.urls(), ",")},
			{"VUS", strconv.Itoa(d.p.LoadGenVUs)},
			{"DURATION", d.p.LoadGenDuration.String()},
		},
		Dir:       runDir,
		Dashboard: true,
		Planned:   d.p.LoadGenDuration,
	})
	lg.Command = res.Command
	if _, err := os.Stat(filepath.Join(runDir, "dashboard.html")); err == nil {
		lg.Dashboard = lg.Dir + "/dashboard.html"
	}
	if res.Err != nil {
		lg.Error = res.Err.Error()
		return
	}
	lg.Requests = res.Summary.Count("http_reqs")
	lg.Cost = res.Cost
	// The requests over the configured duration: the summary's own rate
	// divides by the whole test run, setup included.
	lg.RequestsPerSec = float64(lg.Requests) / d.p.LoadGenDuration.Seconds()
	if v, ok := res.Summary.Value("http_req_duration", "p(99)"); ok {
		lg.P99 = time.Duration(v * float64(time.Millisecond))
	}
	d.progress.note("load generator: %.0f requests/s", lg.RequestsPerSec)
	// The second load generator on the same instances, right after.
	goMeter := healthzMeter.with(selfComponent())
	before := goMeter.sample(0, 0)
	g := goHealthz(ctx, f.urls(), d.p.LoadGenVUs, d.p.LoadGenDuration)
	g.Cost = goMeter.cost(before, goMeter.sample(g.Requests, 0), "the Go client's whole run, its workers' start included")
	d.rep.GoLoadGen = &g
	d.progress.note("Go load generator: %.0f requests/s (p99 %s)", g.RequestsPerSec, g.P99.Round(10*time.Microsecond))
}

// burstStock is the units of a strategy's burst: BURST_STOCK, and for
// batched and redis-reserve, whose rates are not bounded by one commit per
// order (redis-watch's is, by its optimistic retries), at least
// BURST_MIN_SECONDS at k6's /healthz ceiling (k6 sends the burst, and no
// burst through k6 can be faster), so that its burst measures selling
// rather than start-up. Without k6's ceiling, the Go client's stands in.
func (d *demo) burstStock(strategy string) int64 {
	stock := int64(d.p.BurstStock)
	if strategy != "batched" && strategy != reserveStrategy {
		return stock
	}
	ceiling := 0.0
	if lg := d.rep.LoadGen; lg != nil && lg.Error == "" {
		ceiling = lg.RequestsPerSec
	} else if g := d.rep.GoLoadGen; g != nil {
		ceiling = g.RequestsPerSec
	}
	return max(stock, int64(math.Ceil(ceiling*d.p.BurstMin.Seconds())))
}

// burstMaxDuration bounds a burst of r's size: BURST_MAX_DURATION, and at
// least a minute for a burst sized up by burstStock.
func (d *demo) burstMaxDuration(stock int64) time.Duration {
	if stock > int64(d.p.BurstStock) {
		return max(d.p.BurstMaxDuration, time.Minute)
	}
	return d.p.BurstMaxDuration
}

// measureCeilings runs the hot-row statements on one backend; it runs
// before each round of bursts, so that the ceilings are measured beside the
// strategies, and the report takes their median.
func (d *demo) measureCeilings(ctx context.Context, b backend, round int) {
	workers := d.p.Instances * d.p.DBMaxConns
	d.progress.begin("%s hot-row ceiling%s: the service's SQL without the service, %s per measurement", b.Name, roundSuffix(d.p.Rounds, round), d.p.CeilingDuration)
	fail := func(err error) {
		for _, stmt := range hotrow.Statements {
			d.rep.Ceilings = append(d.rep.Ceilings, report.Ceiling{Backend: b.Name, Statement: stmt.Name, SQL: stmt.SQL, Workers: workers, Round: round, Error: err.Error()})
		}
		d.progress.note("%s hot-row ceiling: %v", b.Name, err)
	}
	openCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	db, err := store.Open(openCtx, b.URL, workers)
	cancel()
	if err != nil {
		fail(err)
		return
	}
	defer db.Close()
	if err := db.Migrate(ctx); err != nil {
		fail(err)
		return
	}
	// The statements at the service's concurrency, and the conditional one
	// from a single connection: the row's serial speed, which a strategy
	// that queues orders before the database (a lock) can approach.
	type measurement struct {
		stmt    hotrow.Statement
		workers int
	}
	var measurements []measurement
	for _, stmt := range hotrow.Statements {
		measurements = append(measurements, measurement{stmt, workers})
	}
	measurements = append(measurements, measurement{hotrow.Conditional, 1})
	for _, m := range measurements {
		if ctx.Err() != nil {
			return
		}
		sku := fmt.Sprintf("hotrow-%s-%s-%d-%d", d.runID, m.stmt.Name, m.workers, round)
		res, err := hotrow.Measure(ctx, db, m.stmt, sku,
			hotrow.WithWorkers(m.workers), hotrow.WithDuration(d.p.CeilingDuration), hotrow.WithKeepOrders(d.p.KeepData))
		c := report.Ceiling{
			Backend: b.Name, Statement: m.stmt.Name, SQL: m.stmt.SQL, Workers: m.workers, Round: round,
			Duration: res.Duration, Committed: res.Committed, Failed: res.Failed,
			PerSecond: res.PerSecond, P50: res.P50, P99: res.P99,
		}
		if err != nil {
			c.Error = err.Error()
		}
		d.rep.Ceilings = append(d.rep.Ceilings, c)
		d.progress.note("%-11s from %2d connections: %6.0f transactions/s (p50 %s, p99 %s, %d failed)", m.stmt.Name, m.workers,
			res.PerSecond, res.P50.Round(10*time.Microsecond), res.P99.Round(10*time.Microsecond), res.Failed)
	}
}

// steadyRate is the rate the steady scenario offers on a backend: STEADY_RATE
// if set, otherwise the backend's reference hot-row ceiling (offer what the
// database could do on one row and see how much of it each strategy
// serves), capped at half the load generator's ceiling so that k6 itself is
// never the limit, and never below 50/s.
func (d *demo) steadyRate(b backend) int {
	if d.p.SteadyRate > 0 {
		return d.p.SteadyRate
	}
	rate := 300.0 // when no ceiling could be measured
	if c, ok := d.rep.ReferenceCeiling(b.Name); ok {
		rate = c.PerSecond
	}
	if lg := d.rep.LoadGen; lg != nil && lg.Error == "" && lg.RequestsPerSec > 0 {
		rate = math.Min(rate, lg.RequestsPerSec/2)
	}
	return max(50, int(math.Round(rate/10))*10)
}

// serviceEnv is the environment of an instance of strategy on b.
func (d *demo) serviceEnv(b backend, strategy string) []string {
	env := []string{
		"STRATEGY=" + strategy,
		"DATABASE_URL=" + b.URL,
		"ADMIN_TOKEN=" + d.p.AdminToken,
		"DB_MAX_CONNS=" + strconv.Itoa(d.p.DBMaxConns),
		"LOG_LEVEL=warn",
		"MIGRATE=true",
	}
	if strategy == "naive" && d.p.NaiveRaceWindow != "" {
		env = append(env, "NAIVE_RACE_WINDOW="+d.p.NaiveRaceWindow)
	}
	if isReserved(strategy) {
		if len(d.reserveRedis) > 0 {
			env = append(env, "REDIS_ADDRS="+d.reserveRedis[0])
		}
	} else if needsRedis(strategy) && len(d.redis) > 0 {
		env = append(env, "REDIS_ADDRS="+strings.Join(d.redis, ","))
	}
	if needsEtcd(strategy) && len(d.etcd) > 0 {
		env = append(env, "ETCD_ENDPOINTS="+strings.Join(d.etcd, ","))
	}
	if needsZooKeeper(strategy) && len(d.zk) > 0 {
		env = append(env, "ZK_SERVERS="+strings.Join(d.zk, ","))
	}
	if isLockStrategy(strategy) && d.p.LockTTL != "" {
		env = append(env, "LOCK_TTL="+d.p.LockTTL)
	}
	if d.p.OrderTimeout != "" {
		env = append(env, "ORDER_TIMEOUT="+d.p.OrderTimeout)
	}
	return env
}

// runStrategy starts the instances of one strategy on one backend and runs
// the scenarios of a round against them: the burst, then the steady run.
func (d *demo) runStrategy(ctx context.Context, b backend, strategy string, round int) {
	scenarios := []string{report.Burst, report.Steady}
	label := fmt.Sprintf("%s · %s", b.Name, strategy)
	if d.p.Rounds > 1 {
		label += fmt.Sprintf(" · round %d of %d", round, d.p.Rounds)
	}
	catalog := round == 1 && d.p.CatalogSKUs > 0
	steps := strings.Join(scenarios, " and ")
	if catalog {
		steps = strings.Join(scenarios, ", ") + " and catalog"
	}
	d.progress.begin("%s: %d instances, %s", label, d.p.Instances, steps)
	name := b.Name + "-" + strategy
	logDir := filepath.Join(d.dir, "runs", name, fmt.Sprintf("round-%d", round))
	runs := make([]*report.Run, len(scenarios))
	for i, sc := range scenarios {
		runs[i] = d.newRun(b, strategy, sc, round)
		d.rep.Runs = append(d.rep.Runs, runs[i])
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		for _, r := range runs {
			r.Error = err.Error()
		}
		return
	}
	env := d.serviceEnv(b, strategy)
	began := time.Now()
	f, err := startFleet(ctx, d.p.StockBin, d.p.Instances, env, logDir)
	if err != nil {
		d.progress.note("instances did not start: %v", err)
		for _, r := range runs {
			r.Error = "instances did not start: " + err.Error()
		}
		return
	}
	d.progress.note("instances ready in %.1fs", time.Since(began).Seconds())
	defer func() {
		stopping := time.Now()
		err := f.stop()
		if took := time.Since(stopping); took > 2*time.Second {
			d.progress.note("instances took %.1fs to stop", took.Seconds())
		}
		if err != nil {
			d.progress.note("stopping the instances: %v", err)
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("%s: stopping the instances: %v", name, err))
		}
	}()
	for _, r := range runs {
		if ctx.Err() != nil {
			r.Error = "interrupted"
			continue
		}
		d.runScenario(ctx, f, r)
	}
	if slices.Contains(d.p.GoBurstStrategies, strategy) && ctx.Err() == nil {
		d.runGoBurst(ctx, f, runs[0])
	}
	if round == 1 && d.p.SoldOutOrders > 0 && ctx.Err() == nil {
		d.runSoldOut(ctx, f, runs[0])
	}
	if catalog && ctx.Err() == nil {
		redisMasters := 0
		if isReserved(strategy) {
			redisMasters = 1
		}
		d.runCatalog(ctx, f, b, strategy, redisMasters, round)
	}
}

// sendGoBurst sends g from the Go client to f's instances on a SKU of its
// own, measures its cost (note says what the window holds) and audits it;
// it returns the meter, for what is measured beside it.
func (d *demo) sendGoBurst(ctx context.Context, f *fleet, g *report.GoBurst, note string) *cpuMeter {
	d.skus[g.Backend] = append(d.skus[g.Backend], g.SKU)
	return d.sendMeteredBurst(ctx, f, d.meter(f, d.backend(g.Backend), g.Strategy), g, note)
}

// sendMeteredBurst sends g from the Go client to f's instances, measured
// by meter and the client's own CPU, and audits it.
func (d *demo) sendMeteredBurst(ctx context.Context, f *fleet, meter *cpuMeter, g *report.GoBurst, note string) *cpuMeter {
	meter = meter.with(selfComponent())
	before := meter.sample(0, 0)
	goBurst(ctx, f.urls(), d.p.AdminToken, g, d.burstMaxDuration(g.Stock))
	g.Cost = meter.cost(before, meter.sample(g.Orders+g.SoldOut+g.Other, g.Orders), note)
	d.auditGoBurst(ctx, f, g)
	return meter
}

// auditGoBurst reads g's audit once its orders are all in the database
// (the reservation strategies write them after their 201s: audited
// before, a burst of thousands reads inconsistent, its orders on their
// way).
func (d *demo) auditGoBurst(ctx context.Context, f *fleet, g *report.GoBurst) {
	if isReserved(g.Strategy) {
		if res := d.drain(ctx, f, g.SKU, 0); res.Error != "" {
			g.Error = strings.TrimPrefix(g.Error+"; "+res.Error, "; ")
		}
	}
	audit, err := fetchAudit(ctx, f, d.p.AdminToken, g.SKU)
	if err != nil {
		g.Error = strings.TrimPrefix(g.Error+"; "+err.Error(), "; ")
	}
	g.Audit = audit
}

// runGoBurst sends the k6 burst's load (units, buyers, workers) from the Go
// client to the same instances, on a SKU of its own, and audits it.
func (d *demo) runGoBurst(ctx context.Context, f *fleet, k6 *report.Run) {
	g := report.GoBurst{
		Backend: k6.Backend, Strategy: k6.Strategy, Round: k6.Round,
		SKU:   k6.SKU[:min(len(k6.SKU), 61)] + "-go",
		Stock: k6.Stock, Buyers: k6.Buyers, Workers: k6.VUs,
	}
	meter := d.sendGoBurst(ctx, f, &g, "the Go client's whole burst, from putting the units on sale to the last answer")
	// /healthz beside it: as many requests from as many workers, on a
	// client of their own that connects as the burst's did.
	client := goClient(g.Workers, len(f.urls()))
	g.Healthz = healthzBeside(ctx, client, f.urls(), g.Workers, int(g.Orders+g.SoldOut+g.Other), meter)
	client.CloseIdleConnections()
	d.rep.GoBursts = append(d.rep.GoBursts, g)
	d.progress.note("Go client burst: %d orders in %s, %.0f orders/s, p99 %s, %d sold out, %d other%s",
		g.Orders, g.SellWindow.Round(time.Millisecond), g.OrdersPerSec, g.P99.Round(time.Millisecond), g.SoldOut, g.Other, problemsSuffix(g.Problems()))
}

// runSoldOut sends SOLD_OUT_ORDERS orders from the Go client to the k6
// burst's SKU, sold out by then, and measures what answering them cost:
// the sold-out answer, which should cost about what /healthz does.
func (d *demo) runSoldOut(ctx context.Context, f *fleet, k6 *report.Run) {
	g := report.GoBurst{
		Backend: k6.Backend, Strategy: k6.Strategy, Round: k6.Round,
		SKU: k6.SKU, Buyers: d.p.SoldOutOrders, Workers: k6.VUs,
	}
	if k6.Error != "" {
		g.Error = "the burst before it failed: " + k6.Error
		d.rep.SoldOutRuns = append(d.rep.SoldOutRuns, g)
		return
	}
	client := goClient(g.Workers, len(f.urls()))
	defer client.CloseIdleConnections()
	if err := warmUp(ctx, client, f.urls(), g.Workers); err != nil {
		g.Error = err.Error()
		d.rep.SoldOutRuns = append(d.rep.SoldOutRuns, g)
		return
	}
	g.Warm = true
	meter := d.meter(f, d.backend(k6.Backend), k6.Strategy).with(selfComponent())
	g.Healthz = healthzBeside(ctx, client, f.urls(), g.Workers, g.Buyers, meter)
	before := meter.sample(0, 0)
	goOrders(ctx, client, f.urls(), &g, d.p.BurstMaxDuration)
	g.Cost = meter.cost(before, meter.sample(g.Orders+g.SoldOut+g.Other, g.Orders), "")
	audit, err := fetchAudit(ctx, f, d.p.AdminToken, g.SKU)
	if err != nil {
		g.Error = strings.TrimPrefix(g.Error+"; "+err.Error(), "; ")
	}
	g.Audit = audit
	if g.Orders > 0 {
		g.Error = strings.TrimPrefix(fmt.Sprintf("%s; %d orders were sold on a SKU sold out by its burst", g.Error, g.Orders), "; ")
	}
	d.rep.SoldOutRuns = append(d.rep.SoldOutRuns, g)
	d.progress.note("sold out: %d answers in %s, p99 %s, service %s an answer%s",
		g.SoldOut, g.Duration.Round(time.Millisecond), g.P99.Round(time.Millisecond), perAnswer(g.Cost, report.ComponentService), problemsSuffix(g.Problems()))
}

// perAnswer is a component's CPU per answer in c, for the progress lines.
func perAnswer(c *report.CPUCost, name string) string {
	if c == nil || c.Answered == 0 {
		return "–"
	}
	for _, comp := range c.Components {
		if comp.Name == name && comp.Measured() {
			return (comp.CPU / time.Duration(c.Answered)).Round(100 * time.Nanosecond).String()
		}
	}
	return "–"
}

func problemsSuffix(ps []string) string {
	if len(ps) == 0 {
		return ""
	}
	return " — " + strings.Join(ps, "; ")
}

// batchesOf sums the batch histograms of the scraped metrics files.
func batchesOf(runDir string, files []string, rel string) (*report.Batches, error) {
	var readers []io.Reader
	for _, name := range files {
		f, err := os.Open(filepath.Join(runDir, strings.TrimPrefix(name, rel+"/")))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		readers = append(readers, f)
	}
	return report.ParseBatchMetrics(readers...)
}

// cleanUp deletes the orders of the demo's sales (StartSale with 0 units):
// the report keeps their audit, and the databases do not grow with every
// demo.
func (d *demo) cleanUp(ctx context.Context) {
	if d.p.KeepData {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, b := range d.p.Backends {
		if len(d.skus[b.Name]) == 0 {
			continue
		}
		// Four at a time: the catalogs add a SKU for every SKU ordered.
		const workers = 4
		db, err := store.Open(ctx, b.URL, workers)
		if err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("clean-up on %s: %v", b.Name, err))
			continue
		}
		skus := d.skus[b.Name]
		var mu sync.Mutex
		_ = forEach(ctx, len(skus), workers, func(i int) error {
			if err := db.StartSale(ctx, skus[i], 0); err != nil {
				mu.Lock()
				d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("clean-up of %s on %s: %v", skus[i], b.Name, err))
				mu.Unlock()
			}
			return nil
		})
		db.Close()
	}
}
