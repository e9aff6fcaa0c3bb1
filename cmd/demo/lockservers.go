package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/flashsale/stock/internal/report"
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
func (d *demo) startLockServices(ctx context.Context, out io.Writer) (stop func(), skip []string) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	users := func(needs func(string) bool) []string {
		var u []string
		for _, s := range d.p.Strategies {
			if needs(s) {
				u = append(u, s)
			}
		}
		return u
	}

	if u := users(isReserved); len(u) > 0 {
		if len(d.p.RedisAddrs) > 0 {
			d.reserveRedis = d.p.RedisAddrs[:1]
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.reserveRedis})
		} else if node, err := startDurableRedis(ctx, d.dir); err != nil {
			d.rep.Notes = append(d.rep.Notes, strings.Join(u, ", ")+" skipped: the demo's durable redis-server could not start: "+err.Error())
			skip = append(skip, u...)
		} else {
			stops = append(stops, node.stop)
			d.reserveRedis = node.addrs
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.reserveRedis,
				Started: "one redis-server with appendonly yes, appendfsync always, noeviction"})
			fmt.Fprintf(out, "started a durable redis-server for %s: %s\n", strings.Join(u, ", "), node.addrs[0])
		}
	}
	// The Redis Cluster of the reserved strategies' second catalog run,
	// unless their durable Redis could not start.
	if u := slices.DeleteFunc(clusterCatalogs(d.p), func(s string) bool { return slices.Contains(skip, s) }); len(u) > 0 {
		cluster, err := startRedisCluster(ctx, d.dir, d.p.CatalogClusterMasters)
		if err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("the catalog of %s on a Redis Cluster was left out: the demo's cluster could not start: %v", strings.Join(u, ", "), err))
			fmt.Fprintf(out, "the Redis Cluster could not start, leaving out the catalog of %s on it: %v\n", strings.Join(u, ", "), err)
		} else {
			stops = append(stops, cluster.stop)
			d.cluster = cluster
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS (REDIS_MODE=cluster)", Users: u, Addrs: cluster.addrs,
				Started: fmt.Sprintf("a Redis Cluster of %d masters without replicas (redis-cli --cluster create), appendonly yes, appendfsync always, noeviction, for the catalog only; its logs in redis-cluster/", len(cluster.addrs))})
			fmt.Fprintf(out, "started a Redis Cluster of %d masters for the catalog of %s: %s\n", len(cluster.addrs), strings.Join(u, ", "), strings.Join(cluster.addrs, ","))
		}
	}
	if u := users(func(s string) bool { return needsRedis(s) && !isReserved(s) }); len(u) > 0 {
		if len(d.p.RedisAddrs) > 0 {
			d.redis = d.p.RedisAddrs
			d.lockServices = append(d.lockServices, lockService{Var: "REDIS_ADDRS", Users: u, Addrs: d.redis})
		} else {
			nodes, err := startRedis(ctx, 5, d.dir)
			if err != nil {
				d.rep.Notes = append(d.rep.Notes, "the Redis strategies could not run: "+err.Error())
			} else {
				stops = append(stops, nodes.stop)
				d.redis = nodes.addrs
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
		start          func(context.Context, string) (*coordServer, error)
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
		s, err := c.start(ctx, d.dir)
		if err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("%s skipped: the demo's %s could not start (set %s to use servers of your own): %v",
				strings.Join(u, ", "), c.what, c.variable, err))
			fmt.Fprintf(out, "%s could not start, skipping %s: %v\n", c.what, strings.Join(u, ", "), err)
			skip = append(skip, u...)
			continue
		}
		stops = append(stops, s.stop)
		*c.addrs = []string{s.addr}
		d.lockServices = append(d.lockServices, lockService{Var: c.variable, Users: u, Addrs: *c.addrs, Started: c.started})
		fmt.Fprintf(out, "started %s for %s: %s (log: %s)\n", c.what, strings.Join(u, ", "), s.addr,
			filepath.Join(d.dir, strings.ToLower(c.what)+".log"))
	}
	return stop, skip
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
