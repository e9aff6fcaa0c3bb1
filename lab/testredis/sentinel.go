package testredis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/lab/testproc"
)

// MasterName is the name the Sentinels of StartSentinel know the primary
// by, as the service's REDIS_SENTINEL_MASTER defaults to.
const MasterName = "mymaster"

// Replicated is a Redis primary with its replicas, watched by three
// Sentinels: the shape of a Redis that fails over. Every data server is
// durable (an append-only file fsynced before each answer), as the
// reservation strategies require. After a failover a replica is the
// primary: Master says which is.
type Replicated struct {
	// Servers are the primary, then the replicas, in the roles they were
	// started in.
	Servers   []*Server
	Sentinels []*Sentinel
	// DownAfter is the Sentinels' down-after-milliseconds.
	DownAfter time.Duration
}

// SentinelOptions are the settings of StartReplicated. The zero value is
// two replicas and a failover one second after the primary stops
// answering.
type SentinelOptions struct {
	// Replicas is how many replicas the primary has; 2 by default, so that
	// the new primary still has one after a failover (RESERVE_WAIT_REPLICAS
	// 1 keeps selling). 1 is the least.
	Replicas int
	// Link, when set, is called once per replica with the primary's
	// address and returns the address the replica replicates from (a
	// testproxy's, to make it lag); the primary's by default.
	Link func(primary string) (string, error)
	// LogDir, when set, receives each data server's output in a file of
	// its own; "" (the default) keeps it in memory only.
	LogDir string
	// ReplicaArgs[i], when set, are passed on to replica i (from 0) after
	// Args: a "--replica-priority" makes the Sentinels' choice certain.
	ReplicaArgs [][]string
	// FailoverTimeout is the Sentinels' failover-timeout; 10s by default.
	// It is also how long they leave a replica that replicates from
	// another address than the primary's (a Link) before they point it
	// at the primary.
	FailoverTimeout time.Duration
	// DownAfter is how long the primary must not answer before a Sentinel
	// takes it for down (down-after-milliseconds); 1s by default, short for
	// tests: Redis's own default is 30 s.
	DownAfter time.Duration
	// Args are passed on to both data servers.
	Args []string
}

// StartReplicated starts a primary, its replicas and three Sentinels (a
// quorum of two) for tb, as SpawnReplicated does, and stops them in tb's
// cleanup. It skips tb when redis-server is missing, unless CI=true.
func StartReplicated(tb testing.TB, o SentinelOptions) *Replicated {
	tb.Helper()
	r, err := SpawnReplicated(tb.TempDir(), o)
	testproc.Require(tb, err, ErrNoRedis)
	tb.Cleanup(r.Stop)
	return r
}

// SpawnReplicated starts a primary, its replicas and three Sentinels (a
// quorum of two) outside any test, each with its data in a folder of dir
// (which stays the caller's to delete). It returns once the replicas have
// the primary's data and every Sentinel knows them and the other two
// Sentinels, so a failover can be authorised. It returns ErrNoRedis when
// redis-server is missing. Stop it with Stop.
func SpawnReplicated(dir string, o SentinelOptions) (*Replicated, error) {
	if _, err := os.Stat(Bin); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoRedis, err)
	}
	if o.DownAfter == 0 {
		o.DownAfter = time.Second
	}
	if o.Replicas < 1 {
		o.Replicas = 2
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	r := &Replicated{DownAfter: o.DownAfter}
	folder := func(name string) (string, error) {
		d := filepath.Join(dir, name)
		return d, os.MkdirAll(d, 0o755)
	}
	fail := func(err error) (*Replicated, error) {
		r.Stop()
		return nil, err
	}
	// As docs/replicated.md asks: durable, never evicting; a full resync
	// starts at once (Redis waits 5 s by default for more replicas to
	// share it, which after a failover is 5 s of orders answered 503);
	// a replica that stops acknowledging is dropped after 5 s, not 60.
	durable := append([]string{"--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction",
		"--repl-diskless-sync-delay", "0", "--repl-timeout", "5"}, o.Args...)
	d, err := folder("primary")
	if err != nil {
		return fail(err)
	}
	primary, err := SpawnWith(d, Options{Args: durable, LogFile: logIn(o.LogDir, "primary.log")})
	if err != nil {
		return fail(err)
	}
	r.Servers = append(r.Servers, primary)
	for i := range o.Replicas {
		from := primary.Addr
		if o.Link != nil {
			if from, err = o.Link(from); err != nil {
				return fail(err)
			}
		}
		host, port, _ := strings.Cut(from, ":")
		name := fmt.Sprintf("replica-%d", i+1)
		d, err := folder(name)
		if err != nil {
			return fail(err)
		}
		args := append(slices.Clone(durable), "--replicaof", host, port)
		if i < len(o.ReplicaArgs) {
			args = append(args, o.ReplicaArgs[i]...)
		}
		replica, err := SpawnWith(d, Options{Args: args, LogFile: logIn(o.LogDir, name+".log")})
		if err != nil {
			return fail(err)
		}
		r.Servers = append(r.Servers, replica)
	}
	for i := range 3 {
		d, err := folder(fmt.Sprintf("sentinel-%d", i+1))
		if err != nil {
			return fail(err)
		}
		s, err := spawnSentinel(d, primary.port, o.DownAfter, o.FailoverTimeout)
		if err != nil {
			return fail(err)
		}
		r.Sentinels = append(r.Sentinels, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.waitReady(ctx, primary.Addr); err != nil {
		return fail(err)
	}
	return r, nil
}

// logIn is dir/name, or "" (no log file) without a dir.
func logIn(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name)
}

// Addrs are the Sentinels' addresses: the service's REDIS_ADDRS under
// REDIS_MODE=sentinel.
func (r *Replicated) Addrs() []string {
	addrs := make([]string, len(r.Sentinels))
	for i, s := range r.Sentinels {
		addrs[i] = s.Addr
	}
	return addrs
}

// Stop kills the Sentinels, then the data servers, by their PIDs.
func (r *Replicated) Stop() {
	for _, s := range r.Sentinels {
		s.Stop()
	}
	for _, s := range r.Servers {
		s.Stop()
	}
}

// Master is the data server the Sentinels name as the primary now.
func (r *Replicated) Master(ctx context.Context) (*Server, error) {
	addr, err := r.masterAddr(ctx)
	if err != nil {
		return nil, err
	}
	return r.server(addr)
}

// Replicas are the data servers that are not the primary now.
func (r *Replicated) Replicas(ctx context.Context) ([]*Server, error) {
	m, err := r.Master(ctx)
	if err != nil {
		return nil, err
	}
	var replicas []*Server
	for _, s := range r.Servers {
		if s != m {
			replicas = append(replicas, s)
		}
	}
	return replicas, nil
}

func (r *Replicated) server(addr string) (*Server, error) {
	for _, s := range r.Servers {
		if s.Addr == addr {
			return s, nil
		}
	}
	return nil, fmt.Errorf("the Sentinels name %s, which is none of the servers", addr)
}

// masterAddr asks the Sentinels, in turn, for the primary's address.
func (r *Replicated) masterAddr(ctx context.Context) (string, error) {
	var errs []error
	for _, s := range r.Sentinels {
		c := s.client()
		addr, err := c.GetMasterAddrByName(ctx, MasterName).Result()
		_ = c.Close()
		if err == nil && len(addr) == 2 {
			return addr[0] + ":" + addr[1], nil
		}
		errs = append(errs, err)
	}
	return "", fmt.Errorf("no Sentinel names the primary: %w", errors.Join(errs...))
}

// WatchFailover subscribes to the Sentinels' +switch-master events before
// a fault (until tb's cleanup), as Watch does.
func (r *Replicated) WatchFailover(tb testing.TB, old *Server) func(context.Context) (*Server, error) {
	tb.Helper()
	wait, stop, err := r.Watch(old)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(stop)
	return wait
}

// Watch subscribes to the Sentinels' +switch-master events before a
// fault. wait waits, within ctx, for the first event, then until every
// Sentinel names one new primary other than old and that server answers
// as a master, and returns it; stop ends the subscriptions (call it once
// done, waited or not).
func (r *Replicated) Watch(old *Server) (wait func(context.Context) (*Server, error), stop func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switched := make(chan string, len(r.Sentinels))
	var (
		subs    []*redis.PubSub
		readers sync.WaitGroup
	)
	stop = func() {
		for _, sub := range subs {
			_ = sub.Close()
		}
		readers.Wait()
	}
	for _, s := range r.Sentinels {
		c := s.client()
		sub := c.Subscribe(ctx, "+switch-master")
		subs = append(subs, sub)
		if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
			_ = c.Close()
			stop()
			return nil, nil, fmt.Errorf("subscribe to Sentinel %s: %w", s.Addr, err)
		}
		readers.Go(func() {
			defer c.Close()
			for msg := range sub.Channel() {
				// "<name> <old ip> <old port> <new ip> <new port>"
				if f := strings.Fields(msg.Payload); len(f) == 5 && f[0] == MasterName {
					select {
					case switched <- f[3] + ":" + f[4]:
					default: // one is enough
					}
				}
			}
		})
	}
	wait = func(ctx context.Context) (*Server, error) {
		select {
		case addr := <-switched:
			if addr == old.Addr {
				return nil, fmt.Errorf("a Sentinel switched to the old primary %s", addr)
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("no failover from %s: %w", old.Addr, context.Cause(ctx))
		}
		return r.waitMaster(ctx, old)
	}
	return wait, stop, nil
}

// waitMaster waits until every Sentinel names one primary other than old,
// and that server answers as a master.
func (r *Replicated) waitMaster(ctx context.Context, old *Server) (*Server, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		addrs := map[string]bool{}
		for _, s := range r.Sentinels {
			c := s.client()
			a, err := c.GetMasterAddrByName(ctx, MasterName).Result()
			_ = c.Close()
			if err == nil && len(a) == 2 {
				addrs[a[0]+":"+a[1]] = true
			}
		}
		if len(addrs) == 1 {
			for addr := range addrs {
				if m, err := r.server(addr); err == nil && m != old && m.role(ctx) == "master" {
					return m, nil
				}
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("the Sentinels name %v after the failover from %s: %w", addrs, old.Addr, context.Cause(ctx))
		}
	}
}

// waitReady waits until the replicas hold the primary's data and every
// Sentinel knows them and two other Sentinels (SENTINEL CKQUORUM:
// a failover can be authorised). Sentinels learn of each other by
// messages every 2 s and of replicas by INFO every 10 s: polled.
func (r *Replicated) waitReady(ctx context.Context, primary string) error {
	// WAIT blocks until the replicas' first sync is done: ctx bounds it,
	// not a read timeout.
	c := redis.NewClient(&redis.Options{Addr: primary, MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: -1})
	defer c.Close()
	if err := c.Set(ctx, "testredis:replicated", "1", 0).Err(); err != nil {
		return err
	}
	replicas := len(r.Servers) - 1
	if n, err := c.Do(ctx, "WAIT", replicas, 20_000).Int(); err != nil || n != replicas {
		return fmt.Errorf("the replicas did not take the primary's data: %d of %d, %v", n, replicas, err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ready := true
		for _, s := range r.Sentinels {
			if !s.ready(ctx, replicas, len(r.Sentinels)) {
				ready = false
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("the Sentinels %v do not agree on a quorum: %w", r.Addrs(), context.Cause(ctx))
		}
	}
}

// role is the server's ROLE, "" when it does not answer.
func (s *Server) role(ctx context.Context) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		return ""
	}
	role, _ := v[0].(string)
	return role
}

// Sentinel is one redis-server in Sentinel mode on a free loopback port.
type Sentinel struct {
	Addr string
	conf string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited <-chan struct{}
}

// spawnSentinel starts a Sentinel watching the primary on port primary,
// its configuration (which Sentinel rewrites) in dir.
func spawnSentinel(dir string, primary int, downAfter, failoverTimeout time.Duration) (*Sentinel, error) {
	var err error
	for range 5 { // a probed port can be taken before the Sentinel binds it
		port := testproc.FreePort()
		s := &Sentinel{Addr: "127.0.0.1:" + strconv.Itoa(port), conf: filepath.Join(dir, "sentinel.conf")}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndaemonize no\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\n"+
			"sentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\n"+
			"sentinel parallel-syncs %s 1\n",
			port, dir, MasterName, primary, MasterName, downAfter.Milliseconds(), MasterName, failoverTimeout.Milliseconds(), MasterName)
		if err = os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		if err = s.start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func (s *Sentinel) start() error {
	cmd := exec.Command(Bin, s.conf, "--sentinel")
	_, exited, err := startReady(cmd, "+monitor master", "", false, "redis sentinel "+s.Addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	return nil
}

// Stop kills the Sentinel by its PID and waits for it. It is idempotent.
func (s *Sentinel) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

func (s *Sentinel) client() *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
}

// ready: the Sentinel knows the replicas and sentinels-1 other Sentinels.
func (s *Sentinel) ready(ctx context.Context, replicas, sentinels int) bool {
	c := s.client()
	defer c.Close()
	known, err := c.Replicas(ctx, MasterName).Result()
	if err != nil || len(known) != replicas {
		return false
	}
	others, err := c.Sentinels(ctx, MasterName).Result()
	return err == nil && len(others) == sentinels-1
}
