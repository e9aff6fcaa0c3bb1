package testredis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/lab/testproc"
)

// CLI is where Debian's redis-tools package puts redis-cli, which creates a
// cluster.
const CLI = "/usr/bin/redis-cli"

// Cluster is a Redis Cluster of masters without replicas, each a Server
// (durable: an append-only file fsynced before each answer), on free
// loopback ports whose cluster bus ports (port + 10000) are free too.
type Cluster struct {
	Masters []*Server
}

// StartCluster starts a cluster of n masters (1, or 3 and more) for tb and stops them in tb's
// cleanup. It skips tb when redis-server or redis-cli is missing, unless
// CI=true. The cluster keeps serving the slots of the masters that are up
// while one is down (cluster-require-full-coverage no).
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if _, err := os.Stat(CLI); err != nil {
		if os.Getenv("CI") != "true" {
			tb.Skip("redis-cli not found (set CI=true to make this a failure)")
		}
		tb.Fatal(err)
	}
	c, err := SpawnCluster(tb.TempDir(), n, ClusterOptions{})
	testproc.Require(tb, err, ErrNoRedis)
	tb.Cleanup(c.Stop)
	return c
}

// ClusterOptions are the settings of a cluster started with SpawnCluster.
// The zero value is StartCluster's.
type ClusterOptions struct {
	// Args are passed on to every master after the cluster's own
	// arguments (for example "--maxmemory-policy", "noeviction"); none by
	// default.
	Args []string
	// LogDir, when set, receives master i's output (i from 1) in
	// node-<i>.log, appended; "" (the default) keeps only the first 64 KiB
	// of it in memory, for error messages.
	LogDir string
	// OwnProcessGroup starts every master in a process group of its own,
	// as Options.OwnProcessGroup does; false by default.
	OwnProcessGroup bool
}

// SpawnCluster starts a cluster of n masters (1, or 3 and more) outside
// any test, as StartCluster does for a test, master i (from 1) with its
// data in dir/node-<i>, and returns once every master serves every slot.
// It returns ErrNoRedis when redis-server is missing. Stop it with Stop;
// dir stays the caller's to delete.
func SpawnCluster(dir string, n int, o ClusterOptions) (*Cluster, error) {
	if _, err := os.Stat(CLI); err != nil {
		return nil, fmt.Errorf("redis-cli not found (Debian's redis-tools): %w", err)
	}
	c := &Cluster{}
	for i := range n {
		node := filepath.Join(dir, fmt.Sprintf("node-%d", i+1))
		if err := os.MkdirAll(node, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		so := Options{
			Args: append([]string{"--appendonly", "yes", "--appendfsync", "always",
				"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
				"--cluster-require-full-coverage", "no"}, o.Args...),
			OwnProcessGroup: o.OwnProcessGroup,
		}
		if o.LogDir != "" {
			so.LogFile = filepath.Join(o.LogDir, fmt.Sprintf("node-%d.log", i+1))
		}
		var (
			s   *Server
			err error
		)
		for range 5 { // a probed port can be taken before redis binds it
			so.Port = clusterPort()
			if s, err = SpawnWith(node, so); err == nil {
				break
			}
		}
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Masters = append(c.Masters, s)
	}
	if n < 3 {
		// redis-cli creates clusters of three masters or more; a single
		// master takes every slot itself.
		out, err := exec.Command(CLI, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Masters[0].port), "CLUSTER", "ADDSLOTSRANGE", "0", "16383").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OK") {
			c.Stop()
			return nil, fmt.Errorf("CLUSTER ADDSLOTSRANGE: %v %s", err, out)
		}
	} else {
		args := append([]string{"--cluster", "create"}, c.Addrs()...)
		out, err := exec.Command(CLI, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
		}
	}
	if err := c.waitOK(); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop kills every master (by its own PID) and waits for them. It is
// idempotent.
func (c *Cluster) Stop() {
	for _, s := range c.Masters {
		s.Stop()
	}
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Masters {
		a = append(a, s.Addr)
	}
	return a
}

// WaitOK waits until every master that runs reports cluster_state:ok and
// knows every master, for at most 30 seconds.
func (c *Cluster) WaitOK(tb testing.TB) {
	tb.Helper()
	if err := c.waitOK(); err != nil {
		tb.Fatal(err)
	}
}

func (c *Cluster) waitOK() error {
	deadline := time.Now().Add(30 * time.Second)
	// The nodes agree on their own schedule (gossip): poll them.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok := true
		for _, s := range c.Masters {
			if !s.clusterOK(len(c.Masters)) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis cluster %v not ok after 30s", c.Addrs())
		}
		<-tick.C
	}
}

func (s *Server) clusterOK(masters int) bool {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(masters)) {
		return false
	}
	// Every slot served: the create command has handed them all out.
	return strings.Contains(info, "cluster_slots_ok:16384")
}

// Client returns a cluster client closed at tb's cleanup, with the
// service's settings: no retries of its own, context deadlines honoured.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// clusterPort returns a port that is free, and whose cluster bus port
// (port + 10000) is free too.
func clusterPort() int {
	for {
		p := 20000 + rand.IntN(30000)
		if free(p) && free(p+10000) {
			return p
		}
	}
}

func free(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
