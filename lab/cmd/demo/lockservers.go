package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/lab/report"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testredis"
	"github.com/flashsale/stock/lab/testzk"
)

// lockService is the servers one group of lock strategies ran against.
type lockService struct {
	Var   string   // the service's variable: REDIS_ADDRS, ETCD_ENDPOINTS, ZK_SERVERS
	Users []string // the strategies of the run that use them
	Addrs []string
	// Started says what the demo started; empty when the demo's
	// environment named the servers.
	Started string
}

// startLockServices gives the lock strategies of the plan their servers:
// those the demo's environment names (REDIS_ADDRS, ETCD_ENDPOINTS,
// ZK_SERVERS), or servers of the demo's own on free loopback ports. It
// returns what stops the servers it started, and the strategies to skip
// because their etcd or ZooKeeper could not start; the report gets a note
// for each failure. (A failed Redis is noted, and its strategies still run
// and fail against the service's default address, as before.)
func (d *demo) startLockServices(out io.Writer) (stop func(), skip []string) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	users := func(needs func(string) bool) []string {
		var u []string
		// The failover section's strategies need their servers too.
		for _, s := range append(slices.Clone(d.p.Strategies), d.p.FailoverStrategies...) {
			if needs(s) && !slices.Contains(u, s) {
				u = append(u, s)
			}
		}
		return u
	}

	if u := users(isReserved); len(u) > 0 {
		if len(d.p.RedisAddrs) > 0 {
			d.reserveRedis = d.p.RedisAddrs[:1]
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.reserveRedis})
		} else if addrs, stopRedis, err := startDurableRedis(d.dir); err != nil {
			d.rep.Notes = append(d.rep.Notes, strings.Join(u, ", ")+" skipped: the demo's durable redis-server could not start: "+err.Error())
			skip = append(skip, u...)
		} else {
			stops = append(stops, stopRedis)
			d.reserveRedis = addrs
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.reserveRedis,
				Started: "one redis-server with appendonly yes, appendfsync always, noeviction"})
			fmt.Fprintf(out, "started a durable redis-server for %s: %s\n", strings.Join(u, ", "), addrs[0])
		}
	}
	// The Redis Cluster of the reserved strategies' second catalog run,
	// unless their durable Redis could not start.
	if u := slices.DeleteFunc(clusterCatalogs(d.p), func(s string) bool { return slices.Contains(skip, s) }); len(u) > 0 {
		addrs, stopCluster, err := startRedisCluster(d.dir, d.p.CatalogClusterMasters)
		if err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("the catalog of %s on a Redis Cluster was left out: the demo's cluster could not start: %v", strings.Join(u, ", "), err))
			fmt.Fprintf(out, "the Redis Cluster could not start, leaving out the catalog of %s on it: %v\n", strings.Join(u, ", "), err)
		} else {
			stops = append(stops, stopCluster)
			d.cluster = addrs
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS (REDIS_MODE=cluster)", Users: u, Addrs: addrs,
				Started: fmt.Sprintf("a Redis Cluster of %d masters without replicas (redis-cli --cluster create), appendonly yes, appendfsync always, noeviction, for the catalog only; its logs in redis-cluster/", len(addrs))})
			fmt.Fprintf(out, "started a Redis Cluster of %d masters for the catalog of %s: %s\n", len(addrs), strings.Join(u, ", "), strings.Join(addrs, ","))
		}
	}
	if u := users(func(s string) bool { return needsRedis(s) && !isReserved(s) }); len(u) > 0 {
		if len(d.p.RedisAddrs) > 0 {
			d.redis = d.p.RedisAddrs
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.redis})
		} else {
			addrs, stopRedis, err := startRedis(5, d.dir)
			if err != nil {
				d.rep.Notes = append(d.rep.Notes, "the Redis strategies could not run: "+err.Error())
			} else {
				stops = append(stops, stopRedis)
				d.redis = addrs
				d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.redis,
					Started: "five redis-servers without persistence"})
				fmt.Fprintf(out, "started 5 redis-servers for the lock strategies: %s\n", strings.Join(d.redis, ","))
			}
		}
	}

	for _, c := range []struct {
		variable, what string
		needs          func(string) bool
		given          []string
		start          func(dir string) (addrs []string, stop func(), err error)
		addrs          *[]string
		started        string
	}{
		{"ETCD_ENDPOINTS", "etcd", needsEtcd, d.p.EtcdEndpoints, startEtcd, &d.etcd,
			"a single-member etcd (its log etcd.log in the report's folder)"},
		{"ZK_SERVERS", "ZooKeeper", needsZooKeeper, d.p.ZKServers, startZooKeeper, &d.zk,
			fmt.Sprintf("a standalone ZooKeeper, tickTime=%s (sessions of 1s to 10s), its zoo.cfg in zookeeper/ and its log zookeeper.log in the report's folder", zkTick)},
	} {
		u := users(c.needs)
		if len(u) == 0 {
			continue
		}
		if len(c.given) > 0 {
			*c.addrs = c.given
			d.lockServices = append(d.lockServices, lockService{Var: c.variable, Users: u, Addrs: c.given})
			continue
		}
		fmt.Fprintf(out, "starting %s for %s\n", c.what, strings.Join(u, ", "))
		addrs, stopServer, err := c.start(d.dir)
		if err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("%s skipped: the demo's %s could not start (set %s to use servers of your own): %v",
				strings.Join(u, ", "), c.what, c.variable, err))
			fmt.Fprintf(out, "%s could not start, skipping %s: %v\n", c.what, strings.Join(u, ", "), err)
			skip = append(skip, u...)
			continue
		}
		stops = append(stops, stopServer)
		*c.addrs = addrs
		d.lockServices = append(d.lockServices, lockService{Var: c.variable, Users: u, Addrs: addrs, Started: c.started})
		fmt.Fprintf(out, "started %s for %s: %s (log: %s)\n", c.what, strings.Join(u, ", "), strings.Join(addrs, ","),
			filepath.Join(d.dir, strings.ToLower(c.what)+".log"))
	}
	return stop, skip
}

// The demo's own servers come from the tests' helpers (lab/testredis,
// testetcd, testzk): on free loopback ports, each in a process group of its
// own (a Ctrl-C reaches the demo, which stops them after its instances),
// their logs in the report's folder. Each start returns what stops just
// the servers it started, by their PIDs, and removes the data the report
// need not keep.

// startRedis starts n redis-servers without persistence, their logs
// redis-<i>.log in dir.
func startRedis(n int, dir string) ([]string, func(), error) {
	var servers []*testredis.Server
	stop := func() {
		for _, s := range servers {
			s.Stop()
		}
	}
	var addrs []string
	for i := range n {
		s, err := testredis.SpawnWith(dir, testredis.Options{
			LogFile: filepath.Join(dir, fmt.Sprintf("redis-%d.log", i+1)), OwnProcessGroup: true})
		if err != nil {
			stop()
			return nil, nil, installHint(err)
		}
		servers = append(servers, s)
		addrs = append(addrs, s.Addr)
	}
	return addrs, stop, nil
}

// durable is what redis-reserve requires of its Redis: an append-only file
// fsynced before every answer, and no eviction.
var durable = []string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"}

// startDurableRedis starts redis-reserve's redis-server, its append-only
// file and its log in dir/redis-reserve (both kept).
func startDurableRedis(dir string) ([]string, func(), error) {
	dir = filepath.Join(dir, "redis-reserve")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	s, err := testredis.SpawnWith(dir, testredis.Options{Args: durable,
		LogFile: filepath.Join(dir, "redis-reserve-1.log"), OwnProcessGroup: true})
	if err != nil {
		return nil, nil, installHint(err)
	}
	return []string{s.Addr}, s.Stop, nil
}

// startRedisCluster starts a Redis Cluster of n masters without replicas,
// each as durable as redis-reserve's one Redis, in dir/redis-cluster:
// master i's data in node-<i> (removed once stopped), its log node-<i>.log.
func startRedisCluster(dir string, n int) ([]string, func(), error) {
	dir = filepath.Join(dir, "redis-cluster")
	removeData := func() {
		for i := range n {
			_ = os.RemoveAll(filepath.Join(dir, fmt.Sprintf("node-%d", i+1)))
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	// SpawnCluster's masters fsync their append-only files already.
	c, err := testredis.SpawnCluster(dir, n, testredis.ClusterOptions{Args: []string{"--maxmemory-policy", "noeviction"},
		LogDir: dir, OwnProcessGroup: true})
	if err != nil {
		removeData()
		return nil, nil, installHint(err)
	}
	return c.Addrs(), func() { c.Stop(); removeData() }, nil
}

// startEtcd starts a single-member etcd, its data in dir/etcd (removed
// once stopped: etcd preallocates 64 MB logs) and its log in dir/etcd.log.
func startEtcd(dir string) ([]string, func(), error) {
	data := filepath.Join(dir, "etcd")
	c, err := testetcd.SpawnWith(data, 1, testetcd.Options{
		LogFile: filepath.Join(dir, "etcd.log"), LogLevel: "warn", OwnProcessGroup: true})
	if err != nil {
		_ = os.RemoveAll(data)
		return nil, nil, installHint(err)
	}
	return c.Endpoints(), func() { c.Stop(); _ = os.RemoveAll(data) }, nil
}

// zkTick is the demo's ZooKeeper's tickTime: sessions (LOCK_TTL for
// zk-lock) may last from 2 to 20 ticks, 1 s to 10 s.
const zkTick = 500 * time.Millisecond

// startZooKeeper starts a standalone ZooKeeper that fsyncs its transaction
// log (ZooKeeper's default), its zoo.cfg in dir/zookeeper, its data in
// dir/zookeeper/data (removed once stopped) and its log in
// dir/zookeeper.log.
func startZooKeeper(dir string) ([]string, func(), error) {
	conf := filepath.Join(dir, "zookeeper")
	data := filepath.Join(conf, "data")
	s, err := testzk.SpawnWith(conf, testzk.Options{TickTime: zkTick, MaxSessionTicks: 20, ForceSync: true,
		LogFile: filepath.Join(dir, "zookeeper.log"), OwnProcessGroup: true})
	if err != nil {
		_ = os.RemoveAll(data)
		return nil, nil, installHint(err)
	}
	return []string{s.Addr}, func() { s.Stop(); _ = os.RemoveAll(data) }, nil
}

// installHint adds where a missing server comes from.
func installHint(err error) error {
	if errors.Is(err, testredis.ErrNoRedis) || errors.Is(err, testetcd.ErrNoEtcd) || errors.Is(err, testzk.ErrNoZooKeeper) {
		return fmt.Errorf("%w (make services installs it)", err)
	}
	return err
}

// lockSettings are the report's rows for the servers of the lock strategies
// and their LOCK_TTL.
func (p plan) lockSettings(services []lockService) []report.Setting {
	var s []report.Setting
	for _, ls := range services {
		note := strings.Join(ls.Users, ", ") + ": "
		if ls.Started != "" {
			note += "started by the demo on free loopback ports, stopped at the end: " + ls.Started + "; set " + ls.Var + " to use servers of your own"
		} else {
			note += "set in the demo's environment"
		}
		s = append(s, report.Setting{Name: ls.Var, Value: strings.Join(ls.Addrs, ","), Note: note})
	}
	if slices.ContainsFunc(p.Strategies, isLockStrategy) {
		s = append(s, report.Setting{Name: "LOCK_TTL", Value: orDefault(p.LockTTL, "5s (service default)"),
			Note: "lock strategies: how long a crashed holder can block a SKU; etcd-lock's session lease TTL (whole seconds, at least 1s), zk-lock's session timeout"})
	}
	return s
}
