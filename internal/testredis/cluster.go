package testredis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
	c := &Cluster{}
	for range n {
		var (
			s   *Server
			err error
		)
		for range 5 { // a probed port can be taken before redis binds it
			s, err = Spawn(tb.TempDir(), clusterPort(), "--appendonly", "yes", "--appendfsync", "always",
				"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
				"--cluster-require-full-coverage", "no")
			if err == nil {
				break
			}
		}
		if errors.Is(err, ErrNoRedis) && os.Getenv("CI") != "true" {
			tb.Skip(err, "(set CI=true to make this a failure)")
		}
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(s.Stop)
		c.Masters = append(c.Masters, s)
	}
	if n < 3 {
		// redis-cli creates clusters of three masters or more; a single
		// master takes every slot itself.
		out, err := exec.Command(CLI, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Masters[0].port), "CLUSTER", "ADDSLOTSRANGE", "0", "16383").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "OK") {
			tb.Fatalf("CLUSTER ADDSLOTSRANGE: %v %s", err, out)
		}
	} else {
		args := append([]string{"--cluster", "create"}, c.Addrs()...)
		out, err := exec.Command(CLI, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
		if err != nil {
			tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
		}
	}
	c.WaitOK(tb)
	return c
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok := true
		for _, s := range c.Masters {
			if !s.clusterOK(len(c.Masters)) {
				ok = false
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis cluster %v not ok after 30s", c.Addrs())
		}
		// The nodes agree on their own schedule (gossip): poll them.
		time.Sleep(50 * time.Millisecond)
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
