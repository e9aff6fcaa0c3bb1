package main

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/envconf"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/report"
)

// backend is one database the strategies run on.
type backend struct {
	Name string // "postgres" or "mysql", as store.Engine names them
	URL  string
}

// plan is everything the demo will do, read from the environment (make demo
// passes it through). Each default is in loadPlan; DEMO_QUICK=1 changes the
// sizes so that the whole demo fits in under three minutes.
type plan struct {
	Quick bool
	// Root is the repository; paths below are relative to it.
	Root       string
	StockBin   string
	ReportsDir string
	Backends   []backend
	// Strategies is empty until the service binary is asked (bin/stock
	// strategies), unless DEMO_STRATEGIES names them.
	Strategies []string
	Instances  int
	DBMaxConns int
	// NaiveRaceWindow is given to the naive control only, so its oversell
	// shows; OrderTimeout, when set, to every instance.
	NaiveRaceWindow string
	OrderTimeout    string
	AdminToken      string

	BurstStock, BurstBuyers, BurstVUs int
	BurstMaxDuration                  time.Duration
	// BurstMin sizes the burst of a strategy whose rate is not
	// bounded by one transaction per order (batched, redis-reserve): its stock is at
	// least this long at the load generators' ceiling, so that its burst
	// measures selling, not start-up. Every strategy keeps the buyers per
	// unit of BURST_BUYERS/BURST_STOCK.
	BurstMin time.Duration
	// GoBurstStrategies get the same burst from the Go client too.
	GoBurstStrategies []string
	// SoldOutOrders are sent by the Go client to each strategy's burst SKU
	// once it is sold out (round 1): the service's CPU of a sold-out
	// answer beside /healthz's. 0 leaves the run out.
	SoldOutOrders int
	// The ratio burst: RatioBuyers one-unit orders for RatioStock units
	// from RatioWorkers keep-alive clients over the instances, redis-reserve
	// and conditional taking turns RatioRounds times per backend. 0 rounds
	// leave it out.
	RatioStock, RatioBuyers, RatioWorkers, RatioRounds int
	// Rounds is how often each strategy's burst and steady run, and the
	// ceilings, are measured; the strategies take turns round by round
	// and the report shows the medians.
	Rounds int

	SteadyDuration time.Duration
	SteadyMaxVUs   int
	// SteadyRate is the offered orders/s; 0 means "the backend's reference
	// hot-row ceiling, capped at half the load generator's ceiling".
	SteadyRate int

	CeilingDuration time.Duration
	LoadGenVUs      int
	LoadGenDuration time.Duration

	// RedisAddrs, when set, are used as they are; otherwise the demo starts
	// five redis-servers of its own if a strategy needs Redis.
	RedisAddrs []string
	// EtcdEndpoints (ETCD_ENDPOINTS) and ZKServers (ZK_SERVERS), when set,
	// are used as they are; otherwise the demo starts a single-member etcd
	// when etcd-lock runs and a standalone ZooKeeper when zk-lock runs, on
	// free loopback ports, and stops them at the end.
	EtcdEndpoints []string
	ZKServers     []string
	// LockTTL (LOCK_TTL) is given to the lock strategies when set;
	// otherwise they keep the service's default (5s). For etcd-lock it is
	// the session lease's TTL (at least 1s), for zk-lock the session
	// timeout.
	LockTTL string
	// KeepData leaves the sales' orders in the databases afterwards.
	KeepData bool

	// The catalog scenario (catalog.go), in round 1 of every strategy:
	// CatalogSKUs SKUs of CatalogStock units each (0 SKUs: no catalog),
	// put on sale CatalogAdminWorkers at a time; then CatalogWorkers
	// workers of the Go client order for CatalogDuration, each order's SKU
	// drawn from Zipf(CatalogZipfS, CatalogZipfV) over the SKUs' ranks;
	// then every SKU is audited, CatalogAdminWorkers at a time.
	CatalogSKUs         int
	CatalogStock        int
	CatalogWorkers      int
	CatalogDuration     time.Duration
	CatalogZipfS        float64
	CatalogZipfV        float64
	CatalogAdminWorkers int
	// CatalogKneeStrategies raise the catalog's load step by step: at
	// each of CatalogKneeWorkers in turn, on a catalog of its own, until
	// a step raises orders/s by less than report.KneeGain over every step
	// before it (the knee); the figure is the best step's. The other
	// strategies run once, at CatalogWorkers.
	CatalogKneeStrategies []string
	CatalogKneeWorkers    []int
	// CatalogCluster runs the catalog of redis-reserve and redis-watch a
	// second time on a Redis Cluster of CatalogClusterMasters masters
	// that the demo starts, beside the one durable Redis.
	CatalogCluster        bool
	CatalogClusterMasters int

	// The lifecycle scenario (lifecycle.go), after round 1 of every
	// strategy in LifecycleStrategies (empty: every strategy), on fresh
	// instances: the demo's burst with LifecycleBurstHold and
	// PER_USER_LIMIT=1 and the same burst without them, then a sale of LifecycleStock units to
	// LifecycleBuyers buyers (LifecycleVUs at a time) with holds of
	// LifecycleHoldTTL, swept every LifecycleSweepEvery, for at most
	// LifecycleDuration. Lifecycle false (LIFECYCLE=0) leaves it out.
	Lifecycle            bool
	LifecycleStrategies  []string
	LifecycleStock       int
	LifecycleBuyers      int
	LifecycleVUs         int
	LifecycleHoldTTL     time.Duration
	LifecycleSweepEvery  time.Duration
	LifecycleDuration    time.Duration
	LifecycleBurstHold   time.Duration
	LifecycleBurstRounds int
	// LifecycleGoStrategies get the burst again in the peers' shape: one
	// instance, the Go client, RatioBuyers orders for RatioStock units
	// from RatioWorkers workers, with the lifecycle and without it taking
	// turns, LifecycleGoRounds times (0 leaves it out).
	LifecycleGoStrategies []string
	LifecycleGoRounds     int
	LifecyclePayPercent   int
	LifecycleCancelPct    int
	LifecycleTwicePercent int

	// The failover section (failover.go): FailoverStrategies' bursts on
	// the single server and on its replicated form (Patroni, Galera; the
	// reservation strategies and redis-lock also on Redis under
	// Sentinel), taking turns FailoverRounds times; then, unless
	// !FailoverFaults, the fault suite's failover scenarios 14-16, in
	// their short forms when FailoverShort. Failover false (FAILOVER=0)
	// leaves it out.
	Failover           bool
	FailoverStrategies []string
	FailoverRounds     int
	FailoverFaults     bool
	FailoverShort      bool

	// The capacity estimate (report: "Capacity"): the orders/s of each
	// strategy on a machine of CapacityServiceCores cores for the
	// service's instances and CapacityDatabaseCores for the database,
	// from the CPU per order measured in this run.
	CapacityServiceCores  int
	CapacityDatabaseCores int
}

// loadPlan reads the plan through getenv and reports every bad value at once.
func loadPlan(getenv func(string) string) (plan, error) {
	env := envconf.New(getenv)
	str, integer, bad := env.String, env.Int, env.Bad
	duration := func(name string, def time.Duration) time.Duration { return env.Duration(name, def, false) }
	boolean := func(name string) bool { return env.Bool(name, false) }

	p := plan{Quick: boolean("DEMO_QUICK")}
	// The sizes: the default demo takes about 16 minutes with nine
	// strategies on two backends (batched's burst, sized by
	// BURST_MIN_SECONDS, about a minute of each round), the quick one
	// under 3.
	defStock, defBuyers, defVUs, defMax := 1000, 4000, 200, 60*time.Second
	defSteady, defSteadyVUs, defCeiling, defLoadGen := 8*time.Second, 200, 3*time.Second, 5*time.Second
	defRounds := 3
	// A sold-out answer costs the service about 50 µs: 20,000 of them
	// are a second of its CPU, long enough to read against /healthz's.
	defSoldOutOrders := 20_000
	// Five pairs of the ratio burst (about 5 s a pair): a burst of 3,000
	// units is short, and its single rounds scatter on a busy machine.
	defRatioRounds := 5
	// The catalog: 10,000 SKUs for 5 s, measured (2026-11-28, a busy
	// machine) at about 25 s a run for a database strategy (10.7 s set-up,
	// 8.3 s audit), 50 s for redis-reserve and 77 s on the cluster: about
	// 20 minutes more for the default demo's thirty catalog runs (13
	// strategies and the cluster's 2, on 2 backends). 500 SKUs for 1.5 s
	// in the quick demo, 2.5-10 s a run: about 2 minutes more; with 1,000
	// SKUs for 2 s they had taken 277 s. CATALOG_SKUS=0 leaves it out.
	defCatalogSKUs, defCatalogDuration := 10_000, 5*time.Second
	// The lifecycle: 200 units with 3 s holds, every strategy. Quick: 40
	// units with 2 s holds, and only conditional and redis-watch (whose
	// instances refused holds until issue 25's slice 5; its burst, unlike
	// redis-reserve's, is not sized up to seconds): measured (2026-11-28,
	// a busy machine) at 13-16 s a backend for conditional, two bursts of
	// about a second and the sale 5-8 s of it. The sale ends when
	// every unit is paid: a third of the units come back from a lapsed
	// hold in each round of holds (half the winners pay, a quarter walk
	// away), so 40 units take about five rounds of holds and 200 about
	// six. The duration only bounds it, at about twice that.
	defLifecycleStock, defLifecycleHold, defLifecycleDuration, defLifecycleStrategies := 200, 3*time.Second, time.Minute, ""
	defLifecycleBurstRounds, defLifecycleGoRounds := 3, 3
	if p.Quick {
		defLifecycleStock, defLifecycleHold, defLifecycleDuration, defLifecycleBurstRounds, defLifecycleGoRounds = 40, 2*time.Second, 30*time.Second, 1, 1
		defLifecycleStrategies = "conditional," + watchStrategy
		defRounds = 1
		defStock, defBuyers, defVUs, defMax = 300, 1200, 100, 20*time.Second
		defSteady, defSteadyVUs, defCeiling, defLoadGen = 4*time.Second, 100, 2*time.Second, 2*time.Second
		defCatalogSKUs, defCatalogDuration = 500, 1500*time.Millisecond
		defSoldOutOrders, defRatioRounds = 5_000, 2
	}
	p.Root = str("DEMO_ROOT", ".")
	p.StockBin = str("STOCK_BIN", "bin/stock")
	p.ReportsDir = str("REPORTS_DIR", "reports")
	p.Instances = integer("DEMO_INSTANCES", 3, 1, 10)
	// PostgreSQL allows 100 connections: three instances of at most 30.
	p.DBMaxConns = integer("DB_MAX_CONNS", 16, 1, 30)
	p.NaiveRaceWindow = str("NAIVE_RACE_WINDOW", "5ms")
	p.OrderTimeout = str("ORDER_TIMEOUT", "")
	p.AdminToken = str("DEMO_ADMIN_TOKEN", "demo-admin-token")
	p.BurstStock = integer("BURST_STOCK", defStock, 1, 1_000_000)
	p.BurstBuyers = integer("BURST_BUYERS", defBuyers, 1, 1_000_000)
	p.BurstVUs = integer("BURST_VUS", defVUs, 1, 2000)
	p.BurstMaxDuration = duration("BURST_MAX_DURATION", defMax)
	p.BurstMin = duration("BURST_MIN_SECONDS", 3*time.Second)
	p.GoBurstStrategies = splitList(str("GO_BURST_STRATEGIES", "batched,conditional,redis-reserve"))
	p.Rounds = integer("BURST_ROUNDS", defRounds, 1, 9)
	p.SoldOutOrders = integer("SOLD_OUT_ORDERS", defSoldOutOrders, 0, 1_000_000)
	p.RatioStock = integer("RATIO_STOCK", 3000, 1, 1_000_000)
	p.RatioBuyers = integer("RATIO_BUYERS", 9000, 1, 1_000_000)
	p.RatioWorkers = integer("RATIO_WORKERS", 300, 1, 2000)
	p.RatioRounds = integer("RATIO_ROUNDS", defRatioRounds, 0, 9)
	p.SteadyDuration = duration("STEADY_DURATION", defSteady)
	p.SteadyMaxVUs = integer("STEADY_MAX_VUS", defSteadyVUs, 1, 2000)
	p.SteadyRate = integer("STEADY_RATE", 0, 0, 100_000)
	p.CeilingDuration = duration("CEILING_DURATION", defCeiling)
	p.LoadGenVUs = integer("LOADGEN_VUS", 64, 1, 2000)
	p.LoadGenDuration = duration("LOADGEN_DURATION", defLoadGen)
	p.KeepData = boolean("DEMO_KEEP_DATA")
	p.CatalogSKUs = integer("CATALOG_SKUS", defCatalogSKUs, 0, 100_000)
	// Small enough that the hottest SKUs sell out within the run, so that
	// the end of the stock is tested on them while the rest sell a few.
	p.CatalogStock = integer("CATALOG_STOCK", 20, 1, 1_000_000)
	// As many workers as the burst has VUs: the same concurrency, spread
	// over many SKUs instead of one.
	p.CatalogWorkers = integer("CATALOG_WORKERS", p.BurstVUs, 1, 2000)
	p.CatalogDuration = duration("CATALOG_DURATION", defCatalogDuration)
	// s=1.3, v=1: rank k has weight (1+k)^-1.3, so the hottest SKU takes
	// about 27% of the orders, the five hottest 52%, the ten hottest
	// 61-65% and the hundred hottest 83-88% (10,000 or 1,000 SKUs).
	p.CatalogZipfS = float(env, "CATALOG_ZIPF_S", 1.3, 1, false)
	p.CatalogZipfV = float(env, "CATALOG_ZIPF_V", 1, 1, true)
	// Set-up and audit: a PUT is a transaction (and for redis-reserve a
	// Redis write too), each committed to disk, so more at a time share
	// the commits; 32 spread over three instances stay within their pools.
	p.CatalogAdminWorkers = integer("CATALOG_ADMIN_WORKERS", 32, 1, 256)
	// The knee: the strategies the goals compare (issue 38), from 100
	// workers to 800, each step's orders/s against the steps before it.
	// About 8-12 s a step (set-up, 5 s of load, the audit): 2-4 steps of
	// 3 strategies on 2 backends add 2-5 minutes. Quick: 2 steps.
	defKnee := "100,200,400,800"
	if p.Quick {
		defKnee = "50,200"
	}
	p.CatalogKneeStrategies = splitList(str("CATALOG_KNEE_STRATEGIES", "conditional,batched,redis-reserve"))
	for _, w := range splitList(str("CATALOG_KNEE_WORKERS", defKnee)) {
		n, err := strconv.Atoi(w)
		if err != nil || n < 1 || n > 2000 || (len(p.CatalogKneeWorkers) > 0 && n <= p.CatalogKneeWorkers[len(p.CatalogKneeWorkers)-1]) {
			bad("CATALOG_KNEE_WORKERS=%q: want rising worker counts from 1 to 2000, comma-separated", str("CATALOG_KNEE_WORKERS", defKnee))
			break
		}
		p.CatalogKneeWorkers = append(p.CatalogKneeWorkers, n)
	}
	p.CatalogCluster = env.Bool("CATALOG_CLUSTER", true)
	p.CatalogClusterMasters = integer("CATALOG_CLUSTER_MASTERS", 3, 3, 9)
	p.Lifecycle = env.Bool("LIFECYCLE", true)
	p.LifecycleStrategies = splitList(str("LIFECYCLE_STRATEGIES", defLifecycleStrategies))
	p.LifecycleStock = integer("LIFECYCLE_STOCK", defLifecycleStock, 1, 100_000)
	// Four buyers per unit, as in the burst: demand lasts while units
	// come back (about two winners per unit at half of them paying).
	p.LifecycleBuyers = integer("LIFECYCLE_BUYERS", 4*p.LifecycleStock, 1, 1_000_000)
	p.LifecycleVUs = integer("LIFECYCLE_VUS", min(p.LifecycleBuyers, p.BurstVUs), 1, 2000)
	p.LifecycleHoldTTL = duration("LIFECYCLE_HOLD_TTL", defLifecycleHold)
	p.LifecycleSweepEvery = duration("LIFECYCLE_SWEEP_EVERY", 250*time.Millisecond)
	p.LifecycleDuration = duration("LIFECYCLE_DURATION", defLifecycleDuration)
	// Long enough that no hold lapses during the burst: the burst
	// measures taking holds, not returns.
	p.LifecycleBurstHold = duration("LIFECYCLE_BURST_HOLD_TTL", 15*time.Minute)
	// Pairs of bursts (on, off), for a median of each side: a burst of
	// 300 units lasts a fraction of a second, and single quick pairs of
	// one strategy read from 0.41x to 2.66x on a busy machine. Three
	// pairs by default (about 6 s a pair for 1,000 units), one quick; a
	// burst sized up to BURST_MIN_SECONDS runs one pair (lifecycle.go).
	p.LifecycleBurstRounds = integer("LIFECYCLE_BURST_ROUNDS", defLifecycleBurstRounds, 1, 9)
	p.LifecycleGoStrategies = splitList(str("LIFECYCLE_GO_STRATEGIES", "batched,redis-reserve"))
	p.LifecycleGoRounds = integer("LIFECYCLE_GO_ROUNDS", defLifecycleGoRounds, 0, 9)
	p.LifecyclePayPercent = integer("LIFECYCLE_PAY_PERCENT", 50, 0, 100)
	p.LifecycleCancelPct = integer("LIFECYCLE_CANCEL_PERCENT", 50, 0, 100)
	p.LifecycleTwicePercent = integer("LIFECYCLE_TWICE_PERCENT", 25, 0, 100)
	// The failover section: 20 minutes at full size (2026-12-07: 10.5 for
	// eleven strategies' bursts, three rounds, 9 for the scenarios' full
	// forms). Quick: three strategies, one round, no scenarios (their
	// short forms add about 8 minutes: FAILOVER_FAULTS=1).
	defFailoverStrategies, defFailoverRounds := "", 3
	if p.Quick {
		defFailoverStrategies, defFailoverRounds = "conditional,batched,"+reserveStrategy, 1
	}
	p.Failover = env.Bool("FAILOVER", true)
	p.FailoverStrategies = splitList(str("FAILOVER_STRATEGIES", defFailoverStrategies))
	p.FailoverRounds = integer("FAILOVER_ROUNDS", defFailoverRounds, 1, 9)
	p.FailoverFaults = env.Bool("FAILOVER_FAULTS", !p.Quick)
	p.FailoverShort = env.Bool("FAILOVER_SHORT", p.Quick)
	for _, s := range p.FailoverStrategies {
		if _, ok := strategies.Lookup(s); !ok || strategies.IsControl(s) {
			bad("FAILOVER_STRATEGIES: %q is not a safe strategy of the service", s)
		}
	}
	// Eight and eight: a modest pair of servers, four times this 2-core
	// machine each, so that the estimate reads as a different machine
	// rather than this one.
	p.CapacityServiceCores = integer("CAPACITY_SERVICE_CORES", 8, 1, 1024)
	p.CapacityDatabaseCores = integer("CAPACITY_DATABASE_CORES", 8, 1, 1024)
	if p.LifecycleHoldTTL < time.Second {
		// bin/stock refuses it: a buyer could not pay in time.
		bad("LIFECYCLE_HOLD_TTL=%s is shorter than a second, which the service refuses", p.LifecycleHoldTTL)
	}
	if p.LifecycleBuyers < p.LifecycleStock {
		bad("LIFECYCLE_BUYERS=%d is fewer than LIFECYCLE_STOCK=%d: the sale would not sell out", p.LifecycleBuyers, p.LifecycleStock)
	}
	if v := str("REDIS_ADDRS", ""); v != "" {
		p.RedisAddrs = splitList(v)
	}
	if v := str("ETCD_ENDPOINTS", ""); v != "" {
		p.EtcdEndpoints = splitList(v)
	}
	if v := str("ZK_SERVERS", ""); v != "" {
		p.ZKServers = splitList(v)
	}
	if v := str("DEMO_STRATEGIES", ""); v != "" {
		p.Strategies = splitList(v)
	}
	if v := str("LOCK_TTL", ""); v != "" {
		ttl, err := time.ParseDuration(v)
		switch {
		case err != nil || ttl <= 0:
			bad("LOCK_TTL=%q is not a positive duration such as 5s", v)
		case ttl < time.Second && (len(p.Strategies) == 0 || slices.ContainsFunc(p.Strategies, needsEtcd)):
			// bin/stock refuses it: etcd's smallest lease TTL is 1s.
			bad("LOCK_TTL=%s is below etcd's smallest lease TTL, 1s (etcd-lock); DEMO_STRATEGIES without etcd-lock allows it", v)
		default:
			p.LockTTL = v
		}
	}

	// The servers of the tests (TEST_POSTGRES_URL, TEST_MYSQL_URL, as
	// scripts/ensure-services.sh reads them) with their stock database,
	// unless POSTGRES_URL and MYSQL_URL name the demo's own.
	urls := map[string]string{
		"postgres": str("POSTGRES_URL", stockDatabase(str("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/stock?sslmode=disable"))),
		"mysql":    str("MYSQL_URL", stockDatabase(str("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/stock"))),
	}
	for _, name := range splitList(str("DEMO_BACKENDS", "postgres,mysql")) {
		url, ok := urls[name]
		if !ok {
			bad("DEMO_BACKENDS: %q is not postgres or mysql", name)
			continue
		}
		p.Backends = append(p.Backends, backend{Name: name, URL: url})
	}
	if len(p.Backends) == 0 {
		bad("DEMO_BACKENDS names no backend")
	}
	if p.BurstBuyers < p.BurstStock {
		bad("BURST_BUYERS=%d is fewer than BURST_STOCK=%d: the sale would not sell out", p.BurstBuyers, p.BurstStock)
	}
	return p, env.Err()
}

// float reads a number above lo (at least lo when orEqual), as
// math/rand/v2's Zipf requires of its s (> 1) and v (>= 1).
func float(env *envconf.Reader, name string, def, lo float64, orEqual bool) float64 {
	v := env.String(name, "")
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < lo || (f == lo && !orEqual) || f > 100 {
		op := ">"
		if orEqual {
			op = ">="
		}
		env.Bad("%s=%q is not a number %s %s (and at most 100)", name, v, op, strconv.FormatFloat(lo, 'f', -1, 64))
		return def
	}
	return f
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// The strategies that count the stock in a durable Redis of their own.
const (
	reserveStrategy = strategies.NameRedisReserve
	watchStrategy   = strategies.NameRedisWatch
)

// registered is what the registry says of strategy (the zero value for a
// name it does not know: it needs no server and is in no family).
func registered(strategy string) strategies.Info {
	s, _ := strategies.Lookup(strategy)
	return s.Info
}

func isReserved(strategy string) bool {
	return registered(strategy).Family == strategies.FamilyReserved
}

// needsRedis reports whether a strategy keeps its lock or its stock in
// Redis, and so needs REDIS_ADDRS (redis-lock uses the first address,
// redlock all).
func needsRedis(strategy string) bool {
	s := registered(strategy)
	return s.NeedsServer(strategies.ServerRedis) || s.NeedsServer(strategies.ServerRedisQuorum) || s.NeedsServer(strategies.ServerDurableRedis)
}

// needsEtcd reports whether a strategy takes its lock in etcd, and so needs
// ETCD_ENDPOINTS.
func needsEtcd(strategy string) bool { return registered(strategy).NeedsServer(strategies.ServerEtcd) }

// needsZooKeeper reports whether a strategy takes its lock in ZooKeeper, and
// so needs ZK_SERVERS.
func needsZooKeeper(strategy string) bool {
	return registered(strategy).NeedsServer(strategies.ServerZooKeeper)
}

// isLockStrategy reports whether a strategy takes a lock outside the
// database, and so reads LOCK_TTL.
func isLockStrategy(strategy string) bool {
	s := registered(strategy)
	return s.Family == strategies.FamilyLock && len(s.Needs) > 0
}

// buyersPerUnit is the one ratio of buyers to units of every burst.
func (p plan) buyersPerUnit() float64 {
	return float64(p.BurstBuyers) / float64(p.BurstStock)
}

// mode names the plan's sizes for the report.
func (p plan) mode() string {
	if p.Quick {
		return "quick (DEMO_QUICK=1)"
	}
	return "default"
}

// settings lists the plan for the report, with the reason for each value.
func (p plan) settings(steadyRates map[string]int) []report.Setting {
	s := []report.Setting{
		{Name: "instances per strategy", Value: strconv.Itoa(p.Instances), Note: "separate processes on one database, requests round robin"},
		{Name: "DB_MAX_CONNS", Value: strconv.Itoa(p.DBMaxConns), Note: fmt.Sprintf("per instance, so %d connections in all; the hot-row ceilings use as many", p.Instances*p.DBMaxConns)},
		{Name: "NAIVE_RACE_WINDOW", Value: p.NaiveRaceWindow, Note: "naive only: widens its read-to-write race so the oversell is visible"},
		{Name: "ORDER_TIMEOUT", Value: orDefault(p.OrderTimeout, "3s (service default)"), Note: "past it an order is answered 503 busy"},
		{Name: "rounds", Value: strconv.Itoa(p.Rounds), Note: "ceilings, then every strategy's burst and steady run; the strategies take turns round by round, the report shows medians"},
		{Name: "burst", Value: fmt.Sprintf("STOCK=%d BUYERS=%d VUS=%d MAX_DURATION=%s", p.BurstStock, p.BurstBuyers, p.BurstVUs, p.BurstMaxDuration), Note: "shared-iterations: one order of 1 unit per buyer"},
		{Name: "buyers per unit", Value: strconv.FormatFloat(p.buyersPerUnit(), 'f', -1, 64), Note: "BURST_BUYERS/BURST_STOCK, the same for every strategy"},
		{Name: "BURST_MIN_SECONDS", Value: p.BurstMin.String(), Note: "batched's and redis-reserve's stock is at least this long at k6's /healthz ceiling (their rates are not bounded by one commit per order), with the same buyers per unit; the others keep BURST_STOCK"},
		{Name: "GO_BURST_STRATEGIES", Value: strings.Join(p.GoBurstStrategies, ","), Note: "get the same burst from the Go client (lab/cmd/demo, HTTP/1.1 keep-alive, as many workers as k6's VUs), on a SKU of their own"},
		{Name: "steady", Value: fmt.Sprintf("DURATION=%s MAX_VUS=%d", p.SteadyDuration, p.SteadyMaxVUs), Note: "constant-arrival-rate, all VUs pre-allocated"},
		{Name: "SOLD_OUT_ORDERS", Value: strconv.Itoa(p.SoldOutOrders), Note: "round 1 of every strategy: the Go client's orders on the burst's SKU once it is sold out (as many workers as k6's VUs), for the service's CPU of a sold-out answer; 0 leaves it out"},
		{Name: "ratio burst", Value: p.ratioVars(), Note: "redis-reserve and conditional taking turns on instances of their own, the Go client's keep-alive workers connected before the clock starts; RATIO_ROUNDS=0 leaves it out"},
	}
	if p.CatalogSKUs > 0 {
		s = append(s, report.Setting{Name: "catalog", Value: p.catalogVars(),
			Note: "round 1 of every strategy, on the same instances after its other scenarios: the SKUs put on sale, then the Go client (HTTP/1.1 keep-alive, closed loop) orders one unit at a time, each order's SKU drawn from Zipf(s, v) over the SKUs' ranks (P(k) ∝ (v+k)^-s), then every SKU audited; CATALOG_KNEE_STRATEGIES do it at each of CATALOG_KNEE_WORKERS in turn, a catalog each, until orders/s stops rising"})
		if p.CatalogCluster {
			s = append(s, report.Setting{Name: "CATALOG_CLUSTER", Value: fmt.Sprintf("%d masters", p.CatalogClusterMasters),
				Note: "redis-reserve and redis-watch run the catalog a second time on a Redis Cluster the demo starts (masters without replicas, appendfsync always), REDIS_MODE=cluster; CATALOG_CLUSTER=0 leaves it out"})
		}
	}
	if p.Lifecycle {
		s = append(s, report.Setting{Name: "lifecycle", Value: p.lifecycleVars(),
			Note: "round 1 of each of these strategies, on fresh instances after its other scenarios: the burst with HOLD_TTL=LIFECYCLE_BURST_HOLD_TTL and PER_USER_LIMIT=1, the same burst without them, then loadtest/lifecycle.js's sale with holds of LIFECYCLE_HOLD_TTL; LIFECYCLE=0 leaves it out"})
	}
	for _, b := range p.Backends {
		if r, ok := steadyRates[b.Name]; ok {
			note := "the backend's reference hot-row ceiling in round 1, capped at half the load generator's ceiling"
			if p.SteadyRate > 0 {
				note = "set by STEADY_RATE"
			}
			s = append(s, report.Setting{Name: "steady RATE on " + b.Name, Value: fmt.Sprintf("%d orders/s", r), Note: note})
		}
	}
	s = append(s,
		report.Setting{Name: "hot-row ceiling", Value: fmt.Sprintf("%s per measurement, %d connections (and 1), before each of the %d rounds", p.CeilingDuration, p.Instances*p.DBMaxConns, p.Rounds), Note: "lab/hotrow through the service's store adapters; the report shows the median"},
		report.Setting{Name: "load generator ceiling", Value: fmt.Sprintf("%d VUs for %s", p.LoadGenVUs, p.LoadGenDuration), Note: "k6 against GET /healthz on the same instances; then the Go client with as many workers"},
		report.Setting{Name: "capacity estimate", Value: fmt.Sprintf("CAPACITY_SERVICE_CORES=%d CAPACITY_DATABASE_CORES=%d", p.CapacityServiceCores, p.CapacityDatabaseCores),
			Note: "the cores of the machine the estimate is for: the service's instances together, and the database"},
	)
	for _, b := range p.Backends {
		s = append(s, report.Setting{Name: "DATABASE_URL (" + b.Name + ")", Value: b.URL})
	}
	return s
}

// lifecycleVars are the lifecycle's settings as the environment sets them.
func (p plan) lifecycleVars() string {
	if !p.Lifecycle {
		return "LIFECYCLE=0"
	}
	return fmt.Sprintf("LIFECYCLE_STRATEGIES=%s LIFECYCLE_STOCK=%d LIFECYCLE_BUYERS=%d LIFECYCLE_VUS=%d LIFECYCLE_HOLD_TTL=%s LIFECYCLE_SWEEP_EVERY=%s LIFECYCLE_DURATION=%s LIFECYCLE_BURST_HOLD_TTL=%s LIFECYCLE_BURST_ROUNDS=%d LIFECYCLE_GO_STRATEGIES=%s LIFECYCLE_GO_ROUNDS=%d LIFECYCLE_PAY_PERCENT=%d LIFECYCLE_CANCEL_PERCENT=%d LIFECYCLE_TWICE_PERCENT=%d",
		strings.Join(lifecycleStrategies(p), ","), p.LifecycleStock, p.LifecycleBuyers, p.LifecycleVUs, p.LifecycleHoldTTL, p.LifecycleSweepEvery,
		p.LifecycleDuration, p.LifecycleBurstHold, p.LifecycleBurstRounds, strings.Join(p.LifecycleGoStrategies, ","), p.LifecycleGoRounds,
		p.LifecyclePayPercent, p.LifecycleCancelPct, p.LifecycleTwicePercent)
}

// catalogVars are the catalog's settings as the environment sets them.
func (p plan) catalogVars() string {
	if p.CatalogSKUs == 0 {
		return "CATALOG_SKUS=0"
	}
	cluster := "0"
	if p.CatalogCluster {
		cluster = "1"
	}
	knee := make([]string, len(p.CatalogKneeWorkers))
	for i, w := range p.CatalogKneeWorkers {
		knee[i] = strconv.Itoa(w)
	}
	return fmt.Sprintf("CATALOG_SKUS=%d CATALOG_STOCK=%d CATALOG_WORKERS=%d CATALOG_DURATION=%s CATALOG_ZIPF_S=%s CATALOG_ZIPF_V=%s CATALOG_ADMIN_WORKERS=%d CATALOG_CLUSTER=%s CATALOG_KNEE_STRATEGIES=%s CATALOG_KNEE_WORKERS=%s",
		p.CatalogSKUs, p.CatalogStock, p.CatalogWorkers, p.CatalogDuration,
		strconv.FormatFloat(p.CatalogZipfS, 'f', -1, 64), strconv.FormatFloat(p.CatalogZipfV, 'f', -1, 64), p.CatalogAdminWorkers, cluster,
		strings.Join(p.CatalogKneeStrategies, ","), strings.Join(knee, ","))
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// stockDatabase returns the URL of the database named stock on the server
// of raw, which keeps its credentials and parameters.
func stockDatabase(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw // loadPlan's caller reports an unusable URL when it connects
	}
	u.Path = "/stock"
	return u.String()
}

// ratioVars are the ratio burst's settings, as the variables that set them.
func (p plan) failoverVars() string {
	return fmt.Sprintf("FAILOVER=%s FAILOVER_STRATEGIES=%s FAILOVER_ROUNDS=%d FAILOVER_FAULTS=%s FAILOVER_SHORT=%s",
		onOff(p.Failover), strings.Join(p.FailoverStrategies, ","), p.FailoverRounds, onOff(p.FailoverFaults), onOff(p.FailoverShort))
}

// onOff is a boolean as envconf reads it back.
func onOff(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func (p plan) ratioVars() string {
	return fmt.Sprintf("RATIO_STOCK=%d RATIO_BUYERS=%d RATIO_WORKERS=%d RATIO_ROUNDS=%d", p.RatioStock, p.RatioBuyers, p.RatioWorkers, p.RatioRounds)
}
