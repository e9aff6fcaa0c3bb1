package faults

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// Env is what the scenarios need from their surroundings.
type Env struct {
	// Binary is the service (bin/stock), built without -race.
	Binary string
	// Dir is where each run gets a folder for its logs and, when a history
	// is not proven linearizable, porcupine's HTML.
	Dir string
	// NewDatabase returns the DATABASE_URL of a fresh, empty database of
	// the engine ("postgres" or "mysql") for one run.
	NewDatabase func(ctx context.Context, engine string) (string, error)
	// Postgres and MariaDB are private servers that scenario 5 crashes
	// and restarts; nil skips that run.
	Postgres, MariaDB *DBServer
	// Short selects the short forms (a few seconds of load each).
	Short bool
	// CatalogSKUs is the SKUs on sale in the catalog runs (scenario 9).
	// Default 10,000; short form 1,000.
	CatalogSKUs int
	// CheckTimeout bounds porcupine's search per SKU. Default 20s.
	CheckTimeout time.Duration
	// Logf reports progress. Default: nothing.
	Logf func(format string, args ...any)
}

func (e *Env) logf(format string, args ...any) {
	if e.Logf != nil {
		e.Logf(format, args...)
	}
}

// run is one run of a scenario: its cluster, its load, what it injected.
type run struct {
	env     *Env
	res     Result
	dir     string
	began   time.Time
	dbURL   string
	cluster *Cluster
	redis   []*redisNode
	coord   coordinator // the run's etcd cluster or ZooKeeper, if any
	load    *load
	initial map[string]int64
	// instanceEnv adds environment to some instances, by index.
	instanceEnv map[int][]string
	// afterLoad checks what only the scenario knows, once the load is over
	// (it may set inFlightBound and the recovery time).
	afterLoad func(orders []*order)
	// inFlightBound, when set, bounds the rows whose answer was lost.
	inFlightBound *int
	// afterRows checks what only the scenario knows of the order rows,
	// after the checks every run gets.
	afterRows func(orders []*order, rows []orderRow)
	// redisLostAt, when set, is when the reservation Redis went down to
	// come back without its data (8-reserve-redis-wiped). Its audit cannot
	// answer for the run's SKUs any more, so the database is checked on
	// its own; and a 201 answered to a call made before it may have no row
	// (its order was still in the stream), which is counted, not failed.
	redisLostAt *time.Duration
	// restarted, after redisLostAt, holds the SKUs whose sale the run
	// started again, with their new stock; before, what the database held
	// just before (the first sale's rows and stock rows, which the new
	// sale deletes). The orders of such a SKU called from the loss on
	// belong to its second sale (secondSale), audited in Redis and
	// checked apart from the first.
	restarted map[string]int64
	before    *dbSnapshot
	// cat is the catalog of a catalog run; perSKU its sales' figures.
	cat      *catalog
	perSKU   map[string]*SKUFigures
	cleanups []func()
}

// dbSnapshot is what the run's database held at a moment.
type dbSnapshot struct {
	rows  []orderRow
	keys  []keyRow
	stock map[string]stockRow
}

func (e *Env) newRun(scenario int, name, title string, cfg Config) *run {
	r := &run{env: e, began: time.Now(), initial: map[string]int64{}}
	r.res = Result{Scenario: scenario, Name: name, Title: title, Config: cfg}
	r.dir = filepath.Join(e.Dir, strings.NewReplacer("/", "_", " ", "_").Replace(name))
	r.res.Dir, _ = filepath.Rel(e.Dir, r.dir)
	e.logf("run %s: %s", name, title)
	return r
}

// setUp creates the run's folder and database and starts its Redis servers
// and its service instances.
func (r *run) setUp(ctx context.Context, redisServers int, env ...string) error {
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return err
	}
	if r.dbURL == "" {
		url, err := r.env.NewDatabase(ctx, r.res.Config.Engine)
		if err != nil {
			return fmt.Errorf("database: %w", err)
		}
		r.dbURL = url
	}
	if redisServers > 0 {
		nodes, err := startRedisNodes(redisServers)
		if err != nil {
			return err
		}
		r.redis = nodes
		r.cleanups = append(r.cleanups, func() { stopRedisNodes(nodes) })
		env = append(env, "REDIS_ADDRS="+redisAddrs(nodes))
	}
	env = append(env, "DATABASE_URL="+r.dbURL, "STRATEGY="+r.res.Config.Strategy,
		"ORDER_TIMEOUT="+r.res.Config.OrderTimeout)
	c, err := startCluster(ctx, r.env.Binary, r.dir, r.res.Config.Instances, r.instanceEnv, env...)
	if err != nil {
		return err
	}
	r.cluster = c
	r.cleanups = append(r.cleanups, c.Close)
	return nil
}

// startSales starts a sale of stock units for each SKU.
func (r *run) startSales(ctx context.Context, skus []string, stock int64) error {
	for _, sku := range skus {
		if err := r.cluster.StartSale(ctx, sku, stock); err != nil {
			return err
		}
		r.initial[sku] = stock
	}
	return nil
}

// startLoad starts the run's load against every instance.
func (r *run) startLoad(ctx context.Context, skus []string, spec loadSpec) {
	spec.userPrefix = "u" + randomHex(3)
	c := &r.res.Config
	c.Rate, c.Workers = spec.rate, spec.workers
	c.LoadSeconds, c.ClientTimeout, c.Idempotency = spec.duration.Seconds(), spec.timeout.String(), spec.idempotent
	r.load = startLoad(ctx, r.cluster.Instances, skus, spec)
}

// event records a fault at the load's clock and returns that time.
func (r *run) event(format string, args ...any) time.Duration {
	at := r.load.now()
	what := fmt.Sprintf(format, args...)
	r.res.Events = append(r.res.Events, Event{AtS: seconds(at), What: what})
	r.env.logf("  %6.2fs %s", seconds(at), what)
	return at
}

func (r *run) fail(format string, args ...any) {
	r.res.Failures = append(r.res.Failures, fmt.Sprintf(format, args...))
}

func (r *run) warn(format string, args ...any) {
	r.res.Warnings = append(r.res.Warnings, fmt.Sprintf(format, args...))
}

func (r *run) note(format string, args ...any) {
	r.res.Notes = append(r.res.Notes, fmt.Sprintf(format, args...))
}

// waitUntil polls cond every 10ms until it holds, ctx ends or timeout
// passes; it reports whether cond held.
func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

// abort ends a run that could not be carried out.
func (r *run) abort(err error) Result {
	r.close()
	if r.load != nil {
		r.load.stop()
		r.load.wait()
	}
	r.res.Verdict = VerdictError
	if errors.Is(err, ErrMissing) || errors.Is(err, ErrUnavailable) {
		r.res.Verdict = VerdictSkipped
	}
	r.res.Error = err.Error()
	r.res.Linearizability.Result = "not-run"
	r.res.DurationSeconds = seconds(time.Since(r.began))
	r.res.Line = r.res.verdictLine()
	r.env.logf("%s", r.res.Line)
	return r.res
}

func (r *run) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// finish waits for the load, checks everything, stops the run's processes
// and returns its result. Every instance must be running (not paused) when
// it is called.
func (r *run) finish(ctx context.Context, phases ...phaseMark) Result {
	r.load.wait()
	defer r.close()
	if err := r.check(ctx, phases); err != nil {
		return r.abort(err)
	}
	return r.conclude()
}

// conclude sets the verdict from the failures and warnings found, and the
// run's duration and line, and logs the line.
func (r *run) conclude() Result {
	switch {
	case len(r.res.Failures) > 0 && r.res.Config.Safe:
		r.res.Verdict = VerdictFailed
	case len(r.res.Failures) > 0:
		r.res.Verdict = VerdictExpectedOversell
	case len(r.res.Warnings) > 0:
		r.res.Verdict = VerdictDegraded
	default:
		r.res.Verdict = VerdictOK
	}
	if !r.res.Config.Safe && len(r.res.Failures) == 0 {
		r.note("this configuration is unsafe, but no oversell was seen in this run")
	}
	r.res.DurationSeconds = seconds(time.Since(r.began))
	r.res.Line = r.res.verdictLine()
	r.env.logf("%s", r.res.Line)
	return r.res
}

// phaseMark starts a phase at a time of the load's clock.
type phaseMark struct {
	name string
	at   time.Duration
}

// isReserved: the strategy counts stock in Redis and writes orders to the
// database afterwards (redis-reserve, redis-watch).
func isReserved(strategy string) bool {
	info, _ := strategies.Lookup(strategy)
	return info.Family == strategies.FamilyReserved
}

// startReservationRedis starts the run's durable Redis for the reserved
// strategies and returns the REDIS_ADDRS that points at it.
func (r *run) startReservationRedis() (string, error) {
	node, err := startDurableRedisNode()
	if err != nil {
		return "", err
	}
	r.redis = append(r.redis, node)
	r.cleanups = append(r.cleanups, func() { stopRedisNodes([]*redisNode{node}) })
	return "REDIS_ADDRS=" + node.Addr, nil
}
