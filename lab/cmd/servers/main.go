// Command servers runs, in the foreground, the servers the strategies need
// beyond the database, on the addresses the service uses by default or
// that it prints, so that one strategy can be run by hand:
//
//	make servers            # in one terminal; Ctrl-C stops what it started
//	STRATEGY=etcd-lock DATABASE_URL=... ADMIN_TOKEN=... bin/stock
//
// It starts etcd on 127.0.0.1:2379 (peers on 2380), ZooKeeper on
// 127.0.0.1:2181, a durable Redis for redis-reserve and redis-watch on
// 127.0.0.1:6380 (append-only file, fsync always) and Redlock's five
// Redis servers on 127.0.0.1:6381-6385, each with its data under
// .run/servers/ (kept: a second run comes back with it). A port where
// something already answers is left to it and reported: this command never
// stops or changes a server it did not start. Redis on 127.0.0.1:6379 (the
// service's default) is not started here: make test and make demo set it
// up. It uses the binaries make test installs (Debian's redis-server,
// etcd-server and zookeeper) and stops what it started, by PID, on SIGINT
// or SIGTERM.
//
// With -only patroni, galera or sentinel it starts instead the replicated
// servers of docs/replicated.md, on free ports, and prints the variables
// that point the service at them: PostgreSQL under Patroni (two members,
// synchronous, their own etcd), a three-node MariaDB Galera cluster, a
// Redis primary with two replicas and three Sentinels.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testgalera"
	"github.com/flashsale/stock/lab/testpatroni"
	"github.com/flashsale/stock/lab/testredis"
	"github.com/flashsale/stock/lab/testzk"
)

// server is one server this command may start.
type server struct {
	name  string // for -only
	what  string
	ports []int // fixed ports; none for a cluster on free ports
	start func(dir string) (stop func(), err error)
	env   string // how the service is pointed at it
	// optIn: started only when -only names it (the replicated clusters of
	// docs/replicated.md, on free ports; started is how to reach them).
	optIn   bool
	started func() string
}

func servers() []server {
	redis := func(port int, args ...string) func(string) (func(), error) {
		return func(dir string) (func(), error) {
			s, err := testredis.Spawn(dir, port, args...)
			if err != nil {
				return nil, err
			}
			return s.Stop, nil
		}
	}
	redlock := []int{6381, 6382, 6383, 6384, 6385}
	var redlockAddrs []string
	for _, p := range redlock {
		redlockAddrs = append(redlockAddrs, "127.0.0.1:"+strconv.Itoa(p))
	}
	list := []server{
		{name: "etcd", what: "etcd (etcd-lock, JOB_LOCK=etcd)", ports: []int{2379, 2380},
			start: func(dir string) (func(), error) {
				c, err := testetcd.SpawnAt(dir, 2379, 2380)
				if err != nil {
					return nil, err
				}
				return c.Stop, nil
			},
			env: "STRATEGY=etcd-lock (ETCD_ENDPOINTS defaults to 127.0.0.1:2379)"},
		{name: "zookeeper", what: "ZooKeeper (zk-lock)", ports: []int{2181},
			start: func(dir string) (func(), error) {
				s, err := testzk.Spawn(dir, 2181)
				if err != nil {
					return nil, err
				}
				return s.Stop, nil
			},
			env: "STRATEGY=zk-lock (ZK_SERVERS defaults to 127.0.0.1:2181)"},
		{name: "reserve-redis", what: "durable Redis (redis-reserve, redis-watch)", ports: []int{6380},
			start: redis(6380, "--appendonly", "yes", "--appendfsync", "always"),
			env:   "STRATEGY=redis-reserve REDIS_ADDRS=127.0.0.1:6380"},
		{name: "redlock", what: "five Redis servers (redlock)", ports: redlock,
			start: func(dir string) (func(), error) {
				var stops []func()
				stopAll := func() {
					for _, s := range slices.Backward(stops) {
						s()
					}
				}
				for _, p := range redlock {
					sub := filepath.Join(dir, strconv.Itoa(p))
					if err := os.MkdirAll(sub, 0o755); err != nil {
						stopAll()
						return nil, err
					}
					stop, err := redis(p, "--appendonly", "yes")(sub)
					if err != nil {
						stopAll()
						return nil, err
					}
					stops = append(stops, stop)
				}
				return stopAll, nil
			},
			env: "STRATEGY=redlock REDIS_ADDRS=" + strings.Join(redlockAddrs, ",")},
	}
	return append(list, replicated()...)
}

// replicated are the clusters of docs/replicated.md, each in a new folder
// of its dir on free ports (their data is not kept between runs).
func replicated() []server {
	var patroni *testpatroni.Cluster
	var galera *testgalera.Cluster
	var sentinel *testredis.Replicated
	return []server{
		{name: "patroni", what: "PostgreSQL under Patroni (2 members, synchronous)", optIn: true,
			start: func(dir string) (func(), error) {
				c, err := testpatroni.Spawn(dir, testpatroni.Options{LogDir: dir})
				if err != nil {
					return nil, err
				}
				patroni = c
				return c.Stop, nil
			},
			started: func() string {
				return "DATABASE_URL=" + patroni.URL("postgres") + " (create the stock database on it first)"
			}},
		{name: "galera", what: "MariaDB Galera (3 nodes)", optIn: true,
			start: func(dir string) (func(), error) {
				c, err := testgalera.Spawn(dir, testgalera.Options{LogDir: dir})
				if err != nil {
					return nil, err
				}
				galera = c
				return c.Stop, nil
			},
			started: func() string {
				return "DATABASE_URL=mysql://root@" + strings.Join(galera.Addrs(), ",") + "/mysql (create the stock database on it first)"
			}},
		{name: "sentinel", what: "Redis primary, 2 replicas, 3 Sentinels", optIn: true,
			start: func(dir string) (func(), error) {
				r, err := testredis.SpawnReplicated(dir, testredis.SentinelOptions{LogDir: dir})
				if err != nil {
					return nil, err
				}
				sentinel = r
				return r.Stop, nil
			},
			started: func() string {
				return "STRATEGY=redis-reserve REDIS_MODE=sentinel REDIS_ADDRS=" + strings.Join(sentinel.Addrs(), ",")
			}},
	}
}

func main() {
	dir := flag.String("dir", ".run/servers", "where the servers keep their data")
	only := flag.String("only", "", "comma-separated subset: etcd, zookeeper, reserve-redis, redlock (default: these four); "+
		"patroni, galera, sentinel (the replicated clusters, only when named)")
	flag.Parse()
	var want []string
	if *only != "" {
		want = strings.Split(*only, ",")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var stops []func()
	defer func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}()
	var failed []error
	for _, s := range servers() {
		if want != nil && !slices.Contains(want, s.name) || want == nil && s.optIn {
			continue
		}
		if busy := listening(s.ports); busy != 0 {
			fmt.Printf("%-44s something already answers on 127.0.0.1:%d: left to it\n", s.what, busy)
			continue
		}
		sub, err := filepath.Abs(filepath.Join(*dir, s.name))
		if err == nil {
			err = os.MkdirAll(sub, 0o755)
		}
		if err == nil && s.optIn {
			// Open to the postgres user, whom Patroni's PostgreSQL runs as.
			if sub, err = os.MkdirTemp(sub, "run-"); err == nil {
				err = os.Chmod(sub, 0o755)
			}
		}
		var stopServer func()
		if err == nil {
			stopServer, err = s.start(sub)
		}
		if err != nil {
			failed = append(failed, fmt.Errorf("%s: %w", s.name, err))
			fmt.Printf("%-44s did not start: %v\n", s.what, err)
			continue
		}
		stops = append(stops, stopServer)
		if s.started != nil {
			fmt.Printf("%-44s started, in %s\n", s.what, sub)
			fmt.Printf("%-44s   %s\n", "", s.started())
			continue
		}
		fmt.Printf("%-44s on %s\n", s.what, ports(s.ports))
		fmt.Printf("%-44s   %s\n", "", s.env)
	}
	if len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "servers:", errors.Join(failed...))
		for _, err := range failed {
			if errors.Is(err, testetcd.ErrNoEtcd) || errors.Is(err, testzk.ErrNoZooKeeper) || errors.Is(err, testredis.ErrNoRedis) ||
				errors.Is(err, testpatroni.ErrNoPatroni) || errors.Is(err, testgalera.ErrNoGalera) {
				fmt.Fprintln(os.Stderr, "servers: make services installs what is missing (scripts/ensure-services.sh)")
				break
			}
		}
		return // the deferred stops end what did start
	}
	if len(stops) == 0 {
		return
	}
	fmt.Println("running; Ctrl-C stops the servers started here")
	<-ctx.Done()
}

// listening returns the first of ports on which something accepts
// connections on 127.0.0.1, or 0.
func listening(ports []int) int {
	for _, p := range ports {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), 300*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return p
		}
	}
	return 0
}

func ports(ps []int) string {
	var s []string
	for _, p := range ps {
		s = append(s, "127.0.0.1:"+strconv.Itoa(p))
	}
	return strings.Join(s, ", ")
}
