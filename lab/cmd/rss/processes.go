package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testredis"
	"github.com/flashsale/stock/lab/testzk"
)

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// scratchDatabase creates a database of its own for one strategy's
// instance and returns its URL and what drops it.
func scratchDatabase(ctx context.Context, server, strategy string) (string, func(), error) {
	name := fmt.Sprintf("stock_rss_%s_%d", strings.ReplaceAll(strategy, "-", "_"), os.Getpid())
	admin, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("postgres %s: %w", server, err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rss: drop database %s: %v\n", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			fmt.Fprintf(os.Stderr, "rss: drop database %s: %v\n", name, err)
		}
	}
	return u.String(), drop, nil
}

// lockServers starts the servers strategy needs, fresh ones for each
// strategy (so no state of one run reaches the next), and returns the
// service's variables for them, their PIDs and what stops them.
func lockServers(strategy, dir string) (env []string, pids []int, redisAddrs []string, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range slices.Backward(stops) {
			s()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	redisServers := func(n int, args ...string) ([]string, error) {
		var addrs []string
		for i := range n {
			sub := filepath.Join(dir, fmt.Sprintf("redis%d", i+1))
			if err := os.MkdirAll(sub, 0o755); err != nil {
				return nil, err
			}
			s, err := testredis.Spawn(sub, 0, args...)
			if err != nil {
				return nil, err
			}
			stops = append(stops, s.Stop)
			addrs = append(addrs, s.Addr)
			pids = append(pids, s.PID())
		}
		redisAddrs = append(redisAddrs, addrs...)
		return addrs, nil
	}
	// What the strategy needs besides the database, as its registry
	// entry says: a server of each kind, on a free port.
	info, _ := strategies.Lookup(strategy)
	for _, need := range info.Needs {
		switch need {
		case strategies.ServerRedis:
			addrs, err := redisServers(1)
			if err != nil {
				return nil, nil, nil, stop, err
			}
			env = append(env, "REDIS_ADDRS="+addrs[0])
		case strategies.ServerRedisQuorum:
			addrs, err := redisServers(5)
			if err != nil {
				return nil, nil, nil, stop, err
			}
			env = append(env, "REDIS_ADDRS="+strings.Join(addrs, ","))
		case strategies.ServerDurableRedis:
			addrs, err := redisServers(1, "--appendonly", "yes", "--appendfsync", "always")
			if err != nil {
				return nil, nil, nil, stop, err
			}
			env = append(env, "REDIS_ADDRS="+addrs[0])
		case strategies.ServerEtcd:
			c, err := testetcd.Spawn(filepath.Join(dir, "etcd"), 1)
			if err != nil {
				return nil, nil, nil, stop, err
			}
			stops = append(stops, c.Stop)
			for _, m := range c.Members {
				pids = append(pids, m.PID())
			}
			env = append(env, "ETCD_ENDPOINTS="+strings.Join(c.Endpoints(), ","))
		case strategies.ServerZooKeeper:
			// zk-lock keeps a folder and a fence node per SKU in ZooKeeper.
			s, err := testzk.SpawnSized(filepath.Join(dir, "zookeeper"), 0, "1g")
			if err != nil {
				return nil, nil, nil, stop, err
			}
			stops = append(stops, s.Stop)
			pids = append(pids, s.PID())
			env = append(env, "ZK_SERVERS="+s.Addr)
		}
	}
	return env, pids, redisAddrs, stop, nil
}

// service is the instance under measurement.
type service struct {
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
}

// startService starts bin with the environment of this process less the
// service's own variables, plus env.
func startService(bin string, env []string, logPath string) (*service, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(childEnv(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, err
	}
	s := &service{cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// serviceVars are dropped from the inherited environment: the run sets
// what it needs, and nothing else of the caller's reaches the instance.
var serviceVars = []string{"STRATEGY", "DATABASE_URL", "HTTP_ADDR", "ADMIN_TOKEN", "REDIS_ADDRS", "ETCD_ENDPOINTS",
	"ZK_SERVERS", "LOG_LEVEL", "AUDIT_EVERY", "RESERVE_RECONCILE_EVERY", "ADMISSION_LIMIT",
	"HOLD_TTL", "HOLD_SWEEP_EVERY", "PER_USER_LIMIT", "SOLD_OUT_TTL"}

func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(serviceVars, name) {
			env = append(env, kv)
		}
	}
	return env
}

func (s *service) pid() int { return s.cmd.Process.Pid }

// stop ends the instance by its PID: SIGTERM, then SIGKILL after 20 s.
func (s *service) stop() {
	defer s.log.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// tail is the end of the instance's log, for errors.
func (s *service) tail() string {
	b, err := os.ReadFile(s.log.Name())
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}
