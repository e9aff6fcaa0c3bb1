package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/faults"
	"github.com/flashsale/stock/lab/report"
	"github.com/flashsale/stock/lab/testgalera"
	"github.com/flashsale/stock/lab/testpatroni"
	"github.com/flashsale/stock/lab/testredis"
)

// The failover section (issue 39): what running on replicated servers
// costs each strategy, and what a primary lost mid-sale costs. Each
// strategy of FAILOVER_STRATEGIES runs on three instances on the single
// server and on three more on the replicated form of it, both up at once,
// the Go client's burst going to one then the other FAILOVER_ROUNDS times,
// so that each pair is measured side by side on this shared machine. Then
// the fault suite's failover scenarios (14-16) run as `make faults` runs
// them, and the report shows what each lost.

// replicatedSide is one replicated form of a backend (or of the
// reservation's Redis), started once for every strategy that runs on it.
type replicatedSide struct {
	cluster string // report.Cluster*
	setup   string // for the report
	// env is what an instance i is given on top of the strategy's
	// environment on the single server.
	env func(i int) []string
	// dbAddrs and redisAddrs are the servers whose CPU the meter reads in
	// place of the single server's (nil: the single server's).
	dbAddrs, redisAddrs []string
	// runs reports whether strategy runs on it.
	runs func(strategy string) bool
	// reserveRedis is the durable Redis of the reservation strategies on
	// a replicated database (runReplicated starts it).
	reserveRedis []string
	// variant, when set, is another way to reach the same servers, run
	// after this one for the strategies it runs (stop: nothing of its own).
	variant *replicatedSide
	stop    func()
}

// failoverStrategies are the strategies of the section: FAILOVER_STRATEGIES,
// or every safe strategy of the run.
func failoverStrategies(p plan) []string {
	if !p.Failover {
		return nil
	}
	if len(p.FailoverStrategies) > 0 {
		return p.FailoverStrategies
	}
	return slices.DeleteFunc(slices.Clone(p.Strategies), strategies.IsControl)
}

// failoverSteps is the section's steps: a replicated server per backend,
// Redis under Sentinel, and the fault scenarios.
func failoverSteps(p plan) int {
	names := failoverStrategies(p)
	if len(names) == 0 {
		return 0
	}
	n := len(p.Backends)
	if slices.ContainsFunc(names, sentinelStrategy) {
		n++
	}
	if p.FailoverFaults {
		n++
	}
	return n
}

// sentinelStrategy reports whether s follows a primary through Sentinel
// (REDIS_MODE=sentinel) and keeps there what it must not lose.
func sentinelStrategy(s string) bool {
	return isReserved(s) || s == strategies.NameRedisLock
}

func (d *demo) runFailover(ctx context.Context) {
	names := failoverStrategies(d.p)
	if len(names) == 0 {
		return
	}
	fo := &report.Failover{Short: d.p.FailoverShort}
	d.rep.Failover = fo
	dir := filepath.Join(d.dir, "failover")
	for _, b := range d.p.Backends {
		if ctx.Err() != nil {
			return
		}
		d.runReplicated(ctx, b, names, filepath.Join(dir, b.Name), func() (*replicatedSide, error) { return startReplicatedDB(ctx, b, filepath.Join(dir, b.Name)) })
	}
	if ctx.Err() == nil && slices.ContainsFunc(names, sentinelStrategy) {
		b := d.p.Backends[0]
		d.runReplicated(ctx, b, names, filepath.Join(dir, "sentinel"), func() (*replicatedSide, error) { return startSentinel(filepath.Join(dir, "sentinel")) })
	}
	if ctx.Err() == nil && d.p.FailoverFaults {
		d.runFailoverFaults(ctx, filepath.Join(dir, "faults"))
	}
}

// startReplicatedDB starts b's replicated form: PostgreSQL under Patroni
// (two members, synchronous), or a three-node Galera cluster whose node i
// instance i writes through.
func startReplicatedDB(ctx context.Context, b backend, dir string) (*replicatedSide, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	all := func(string) bool { return true }
	if b.Name == "postgres" {
		// Patroni runs PostgreSQL as the postgres user, which must reach
		// its data: a folder of the system's temporary one, not the
		// report's, which may sit under a home it cannot search. The
		// members' output goes to the report's.
		data, err := os.MkdirTemp("", "demo-patroni-")
		if err != nil {
			return nil, err
		}
		if err := os.Chmod(data, 0o711); err != nil {
			return nil, errors.Join(err, os.RemoveAll(data))
		}
		c, err := testpatroni.Spawn(data, testpatroni.Options{LogDir: dir})
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(data))
		}
		stop := func() {
			c.Stop()
			_ = os.RemoveAll(data)
		}
		url, err := c.CreateDatabase(ctx, "stock")
		if err != nil {
			stop()
			return nil, err
		}
		var addrs []string
		for _, m := range c.Members {
			addrs = append(addrs, m.Addr)
		}
		return &replicatedSide{cluster: report.ClusterPatroni, setup: "Patroni: a primary and a synchronous standby",
			env: func(int) []string { return []string{"DATABASE_URL=" + url} }, dbAddrs: addrs, runs: all, stop: stop}, nil
	}
	c, err := testgalera.Spawn(dir, testgalera.Options{LogDir: dir})
	if err != nil {
		return nil, err
	}
	if err := c.CreateDatabase(ctx, 0, "stock"); err != nil {
		c.Stop()
		return nil, err
	}
	// Every instance writing through one node is how Galera's users ran a
	// hot row (a write set from another node conflicts with it at
	// certification, and one of the two is rolled back): measured beside
	// the spread, whose instances send a SKU's transactions through one
	// node by themselves, for the strategies the goal names and the
	// reference. A URL naming that node alone: with several, the service
	// routes by SKU whatever their order.
	oneWriter := &replicatedSide{cluster: report.ClusterGaleraOneWriter, setup: "Galera: three nodes, every instance through the first alone",
		env: func(int) []string { return []string{"DATABASE_URL=mysql://root@" + c.Addrs()[0] + "/stock"} }, dbAddrs: c.Addrs(),
		runs: func(s string) bool {
			return s == strategies.NameConditional || slices.Contains(report.ReplicationGoalStrategies, s)
		}}
	return &replicatedSide{cluster: report.ClusterGalera, setup: "Galera: three nodes, an instance at each, a SKU through one",
		env: func(i int) []string { return []string{"DATABASE_URL=" + c.URLFrom(i, "stock")} }, dbAddrs: c.Addrs(), runs: all,
		variant: oneWriter, stop: c.Stop}, nil
}

// startSentinel starts a Redis primary with two replicas and three
// Sentinels, for the strategies that follow a primary through them.
func startSentinel(dir string) (*replicatedSide, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r, err := testredis.SpawnReplicated(dir, testredis.SentinelOptions{LogDir: dir})
	if err != nil {
		return nil, err
	}
	var data []string
	for _, s := range r.Servers {
		data = append(data, s.Addr)
	}
	env := []string{"REDIS_MODE=sentinel", "REDIS_ADDRS=" + strings.Join(r.Addrs(), ",")}
	return &replicatedSide{cluster: report.ClusterSentinel, setup: "Redis under Sentinel: a primary and two replicas, 201 once a replica has it",
		env: func(int) []string { return env }, redisAddrs: data, runs: sentinelStrategy, stop: r.Stop}, nil
}

// runReplicated starts the replicated side and runs every strategy that
// runs on it against it and against b's single server.
func (d *demo) runReplicated(ctx context.Context, b backend, names []string, dir string, start func() (*replicatedSide, error)) {
	d.progress.begin("%s · failover: starting the replicated servers", b.Name)
	side, err := start()
	if err != nil {
		why := fmt.Sprintf("%s: the replicated servers did not start: %v", b.Name, err)
		if errors.Is(err, testpatroni.ErrNoPatroni) || errors.Is(err, testgalera.ErrNoGalera) || errors.Is(err, testredis.ErrNoRedis) {
			why += " (make services installs them)"
		}
		d.progress.note("%s", why)
		d.rep.Failover.Errors = append(d.rep.Failover.Errors, why)
		return
	}
	defer side.stop()
	d.progress.note("%s ready", side.setup)
	// The reservation strategies on a replicated database get a durable
	// Redis of their own: two fleets on one Redis and two databases would
	// consume each other's streams (one Redis serves one database).
	if side.redisAddrs == nil && slices.ContainsFunc(names, isReserved) {
		addrs, stopRedis, err := startDurableRedis(dir)
		if err != nil {
			why := fmt.Sprintf("%s: the replicated side's durable Redis did not start: %v", b.Name, err)
			d.progress.note("%s", why)
			d.rep.Failover.Errors = append(d.rep.Failover.Errors, why)
			names = slices.DeleteFunc(slices.Clone(names), isReserved)
		} else {
			defer stopRedis()
			for v := side; v != nil; v = v.variant {
				v.reserveRedis = addrs
			}
		}
	}
	for _, s := range names {
		if ctx.Err() != nil {
			return
		}
		for v := side; v != nil && ctx.Err() == nil; v = v.variant {
			if v.runs(s) {
				d.runReplicatedPair(ctx, b, s, v, filepath.Join(dir, s, v.cluster))
			}
		}
	}
}

// runReplicatedPair is one strategy's bursts on the single server and on
// the replicated side, taking turns round by round.
func (d *demo) runReplicatedPair(ctx context.Context, b backend, strategy string, side *replicatedSide, dir string) {
	x := &report.Replication{Backend: b.Name, Cluster: side.cluster, Strategy: strategy, Setup: side.setup}
	d.rep.Failover.Replication = append(d.rep.Failover.Replication, x)
	d.progress.note("%s on %s: %d rounds, the single server and the replicated one taking turns", strategy, side.cluster, d.p.FailoverRounds)
	single := d.serviceEnv(b, strategy)
	fleets := make([]*fleet, 2)
	defer func() {
		for i, f := range fleets {
			if f != nil {
				d.stopFleet(f, fmt.Sprintf("%s-%s failover %d", b.Name, strategy, i))
			}
		}
	}()
	replicated := side.env
	if isReserved(strategy) && side.reserveRedis != nil {
		replicated = func(i int) []string { return append(side.env(i), "REDIS_ADDRS="+strings.Join(side.reserveRedis, ",")) }
	}
	for i, each := range []func(int) []string{nil, replicated} {
		logDir := filepath.Join(dir, []string{"single", side.cluster}[i])
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			x.Error = err.Error()
			return
		}
		f, err := startFleetWith(ctx, d.p.StockBin, d.p.Instances, single, each, logDir)
		if err != nil {
			x.Error = "instances did not start: " + err.Error()
			d.progress.note("%s", x.Error)
			return
		}
		fleets[i] = f
	}
	stock := d.burstStock(strategy)
	buyers := int(float64(stock) * d.p.buyersPerUnit())
	stamp := time.Now().UTC().Format("150405")
	for round := 1; round <= d.p.FailoverRounds && ctx.Err() == nil; round++ {
		for i, out := range []*[]report.GoBurst{&x.Single, &x.Replicated} {
			g := report.GoBurst{Backend: b.Name, Strategy: strategy, Round: round, Stock: stock, Buyers: buyers, Workers: d.p.BurstVUs, Warm: true,
				SKU: fmt.Sprintf("fo-%s-%s-%s-%d-%d", side.cluster, strategy, stamp, round, i)}
			if i == 0 {
				d.sendGoBurst(ctx, fleets[i], &g, "the Go client's burst, from putting the units on sale (and connecting) to the last answer")
			} else {
				d.sendReplicatedBurst(ctx, fleets[i], b, side, &g)
			}
			*out = append(*out, g)
		}
		s, r := x.Single[len(x.Single)-1], x.Replicated[len(x.Replicated)-1]
		ratio := 0.0
		if s.OrdersPerSec > 0 {
			ratio = r.OrdersPerSec / s.OrdersPerSec
		}
		d.progress.note("round %d: single %.0f orders/s, %s %.0f orders/s (%.2f×)%s%s", round, s.OrdersPerSec, side.cluster, r.OrdersPerSec, ratio,
			problemsSuffix(s.Problems()), problemsSuffix(r.Problems()))
	}
}

// sendReplicatedBurst is sendGoBurst on the replicated side: its meter
// reads the replicated servers in place of the single ones, and its sale
// is not the clean-up's (the servers go with the section).
func (d *demo) sendReplicatedBurst(ctx context.Context, f *fleet, b backend, side *replicatedSide, g *report.GoBurst) {
	meter := d.meter(f, b, g.Strategy)
	redis := side.redisAddrs
	if isReserved(g.Strategy) && side.reserveRedis != nil {
		redis = side.reserveRedis
	}
	for _, swap := range []struct {
		name  string
		addrs []string
	}{{compDatabase, side.dbAddrs}, {report.ComponentRedis, redis}} {
		if swap.addrs == nil {
			continue
		}
		pids, err := d.serverPIDs(swap.addrs)
		meter.replace(serverComponent(swap.name, pids, nil, err))
	}
	d.sendMeteredBurst(ctx, f, meter, g, "the Go client's burst on the replicated servers, from putting the units on sale (and connecting) to the last answer")
}

// runFailoverFaults runs the fault suite's failover scenarios (14 Redis
// under Sentinel, 15 Patroni, 16 Galera) as make faults does, each on
// servers of its own, and keeps their results for the section.
func (d *demo) runFailoverFaults(ctx context.Context, dir string) {
	form := "full"
	if d.p.FailoverShort {
		form = "short"
	}
	d.progress.begin("failover · the fault suite's scenarios 14, 15 and 16, %s forms", form)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		d.rep.Failover.Errors = append(d.rep.Failover.Errors, "failover scenarios: "+err.Error())
		return
	}
	env := &faults.Env{Binary: d.p.StockBin, Dir: dir, Short: d.p.FailoverShort,
		Logf: func(format string, args ...any) { d.progress.note(format, args...) }}
	// Scenario 14 keeps its orders in a database of its own: a private
	// PostgreSQL, started when first needed.
	var private *faults.DBServer
	defer func() {
		if private != nil {
			private.Close()
		}
	}()
	env.NewDatabase = func(ctx context.Context, engine string) (string, error) {
		if engine != "postgres" {
			return "", fmt.Errorf("%w: the demo's failover runs keep a private PostgreSQL only", faults.ErrMissing)
		}
		if private == nil {
			s, err := faults.StartPostgres(ctx)
			if err != nil {
				return "", err
			}
			private = s
		}
		return private.NewDatabase(ctx, "failover_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	}
	d.rep.Failover.Faults = env.All(ctx, func(n int) bool { return n >= 14 && n <= 16 })
}
