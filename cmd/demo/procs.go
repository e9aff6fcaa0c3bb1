package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// process is one child the demo started. Its Wait runs in a goroutine owned
// by the process, which reports the exit on exited; stop signals the child
// by its PID and joins that goroutine.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error // valid once exited is closed
}

// startProcess starts bin with args and exactly the environment env, its
// output going to logPath.
func startProcess(name, bin string, args, env []string, logPath string) (*process, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so a Ctrl-C in the terminal reaches the
	// demo first and the demo stops its children in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to grace for the exit, then kills. It is
// safe to call on a process that has exited.
func (p *process) stop(grace time.Duration) error {
	defer p.log.Close()
	if !p.running() {
		return p.exitErr()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.name, grace)
	}
}

func (p *process) exitErr() error {
	if p.err == nil {
		return fmt.Errorf("%s exited", p.name)
	}
	return fmt.Errorf("%s exited: %w", p.name, p.err)
}

// tail returns the last lines of the process's log, for error messages.
func (p *process) tail(n int) string {
	f, err := os.Open(p.log.Name())
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free port on 127.0.0.1. Another process
// could take it before the child binds it; the child then fails to start,
// which the caller reports.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// instance is one service process.
type instance struct {
	*process
	url string
}

// fleet is the instances of one strategy on one backend.
type fleet struct {
	instances []*instance
	env       []string // what every instance got, for the report
}

// serviceEnv are the variables the demo sets for the service; any value the
// demo's own environment has for them is overridden or removed, so that
// e.g. NAIVE_RACE_WINDOW never reaches a strategy that refuses it.
var serviceEnv = []string{"STRATEGY", "DATABASE_URL", "HTTP_ADDR", "ADMIN_TOKEN", "DB_MAX_CONNS",
	"NAIVE_RACE_WINDOW", "REDIS_ADDRS", "REDIS_MODE", "ETCD_ENDPOINTS", "ZK_SERVERS", "LOCK_TTL", "ORDER_TIMEOUT", "LOG_LEVEL", "MIGRATE"}

// childEnv is the demo's environment without the variables in drop, plus
// add.
func childEnv(add, drop []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, name) {
			env = append(env, kv)
		}
	}
	return append(env, add...)
}

// startFleet starts n instances with env and waits until each answers
// /readyz; on any failure the ones started are stopped again.
func startFleet(ctx context.Context, bin string, n int, env []string, logDir string) (*fleet, error) {
	f := &fleet{env: env}
	for i := range n {
		port, err := freePort()
		if err != nil {
			f.stop()
			return nil, err
		}
		name := fmt.Sprintf("i%d", i+1)
		penv := childEnv(append(append([]string{}, env...), fmt.Sprintf("HTTP_ADDR=127.0.0.1:%d", port)), serviceEnv)
		p, err := startProcess("instance "+name, bin, nil, penv, filepath.Join(logDir, "instance-"+name+".log"))
		if err != nil {
			f.stop()
			return nil, err
		}
		f.instances = append(f.instances, &instance{process: p, url: fmt.Sprintf("http://127.0.0.1:%d", port)})
	}
	for _, in := range f.instances {
		if err := waitReady(ctx, in, 30*time.Second); err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// waitReady polls /readyz until 200, the process exits, or timeout.
func waitReady(ctx context.Context, in *instance, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.url+"/readyz", nil)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-in.exited:
			return fmt.Errorf("%w before it was ready:\n%s", in.exitErr(), in.tail(5))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w\n%s", in.name, timeout, ctx.Err(), in.tail(5))
		case <-tick.C:
		}
	}
}

func (f *fleet) urls() []string {
	var out []string
	for _, in := range f.instances {
		out = append(out, in.url)
	}
	return out
}

// dead returns an error for every instance that exited.
func (f *fleet) dead() error {
	var errs []error
	for _, in := range f.instances {
		if !in.running() {
			errs = append(errs, fmt.Errorf("%w:\n%s", in.exitErr(), in.tail(5)))
		}
	}
	return errors.Join(errs...)
}

// stop stops every instance; they shut down in parallel.
func (f *fleet) stop() error {
	if f == nil {
		return nil
	}
	errs := make(chan error, len(f.instances))
	for _, in := range f.instances {
		go func() {
			if !in.running() {
				// Already reported by dead.
				in.log.Close()
				errs <- nil
				return
			}
			errs <- in.stop(15 * time.Second)
		}()
	}
	var all []error
	for range f.instances {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// redisNodes are redis-servers the demo started for the lock strategies.
type redisNodes struct {
	procs []*process
	addrs []string
	// data are folders removed once the servers have stopped (the
	// cluster's append-only files; the report keeps their logs).
	data []string
}

// startRedis starts n redis-servers on free ports, without persistence.
func startRedis(ctx context.Context, n int, dir string) (*redisNodes, error) {
	return startRedisNodes(ctx, n, dir, "redis", []string{"--save", "", "--appendonly", "no"})
}

// startDurableRedis starts one redis-server that fsyncs its append-only
// file before every answer and never evicts: what redis-reserve requires.
func startDurableRedis(ctx context.Context, dir string) (*redisNodes, error) {
	dir = filepath.Join(dir, "redis-reserve")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return startRedisNodes(ctx, 1, dir, "redis-reserve",
		[]string{"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"})
}

func startRedisNodes(ctx context.Context, n int, dir, name string, persistence []string) (*redisNodes, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (make services installs it): %w", err)
	}
	r := &redisNodes{}
	for i := range n {
		port, err := freePort()
		if err != nil {
			r.stop()
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		args := append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--daemonize", "no", "--dir", dir}, persistence...)
		p, err := startProcess(name+" "+addr, bin, args, os.Environ(), filepath.Join(dir, fmt.Sprintf("%s-%d.log", name, i+1)))
		if err != nil {
			r.stop()
			return nil, err
		}
		r.procs = append(r.procs, p)
		r.addrs = append(r.addrs, addr)
	}
	for i, addr := range r.addrs {
		if err := waitRedis(ctx, addr, r.procs[i], 10*time.Second); err != nil {
			r.stop()
			return nil, err
		}
	}
	return r, nil
}

// waitRedis sends PING until +PONG.
func waitRedis(ctx context.Context, addr string, p *process, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if pingRedis(addr) == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w:\n%s", p.exitErr(), p.tail(5))
		case <-ctx.Done():
			return fmt.Errorf("redis at %s does not answer: %w", addr, ctx.Err())
		case <-tick.C:
		}
	}
}

func pingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redis at %s answered %q", addr, strings.TrimSpace(line))
	}
	return nil
}

func (r *redisNodes) stop() {
	if r == nil {
		return
	}
	for _, p := range r.procs {
		_ = p.stop(5 * time.Second)
	}
	for _, d := range r.data {
		_ = os.RemoveAll(d)
	}
}

// coordServer is a coordination server the demo started for a lock
// strategy: a single-member etcd or a standalone ZooKeeper.
type coordServer struct {
	proc *process
	addr string // host:port for the service (ETCD_ENDPOINTS, ZK_SERVERS)
	// data is the server's data folder, removed once it has stopped: both
	// preallocate 64 MB logs, which the report's folder need not keep.
	data string
}

// stop stops the server by its PID (SIGTERM, SIGKILL after 10 s) and
// removes its data.
func (c *coordServer) stop() {
	if c == nil {
		return
	}
	_ = c.proc.stop(10 * time.Second)
	if c.data != "" {
		_ = os.RemoveAll(c.data)
	}
}

// etcdBin is Debian's etcd (etcd-server), or whichever etcd is on PATH.
func etcdBin() (string, error) {
	if bin, err := exec.LookPath("etcd"); err == nil {
		return bin, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", errors.New("etcd is not installed (make services installs etcd-server)")
}

// startEtcd starts a single-member etcd on two free loopback ports, its
// data in dir/etcd, and waits until /health says so.
func startEtcd(ctx context.Context, dir string) (*coordServer, error) {
	bin, err := etcdBin()
	if err != nil {
		return nil, err
	}
	client, err := freePort()
	if err != nil {
		return nil, err
	}
	peer, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", client)
	clientURL, peerURL := "http://"+addr, fmt.Sprintf("http://127.0.0.1:%d", peer)
	data := filepath.Join(dir, "etcd")
	p, err := startProcess("etcd "+addr, bin, []string{
		"--name", "demo", "--data-dir", data,
		"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "demo=" + peerURL, "--initial-cluster-state", "new",
		"--logger", "zap", "--log-level", "warn", "--log-outputs", "stderr",
	}, os.Environ(), filepath.Join(dir, "etcd.log"))
	if err != nil {
		return nil, err
	}
	s := &coordServer{proc: p, addr: addr, data: data}
	if err := waitUntil(ctx, p, 30*time.Second, func() error { return etcdHealthy(ctx, addr) }); err != nil {
		s.stop()
		return nil, fmt.Errorf("etcd at %s: %w", addr, err)
	}
	return s, nil
}

// etcdHealthy asks GET /health, which answers {"health":"true"} once the
// member has a leader and serves requests.
func etcdHealthy(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&h); err != nil {
		return fmt.Errorf("/health: %s: %w", resp.Status, err)
	}
	if h.Health != "true" {
		return fmt.Errorf("/health: %s %q %s", resp.Status, h.Health, h.Reason)
	}
	return nil
}

// zkJars are where Debian's zookeeper package puts the server and its
// logging; zookeeper.jar's manifest names the rest of its class path.
var zkJars = struct {
	server  string
	logging []string
}{
	server:  "/usr/share/java/zookeeper.jar",
	logging: []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"},
}

// zkTick is the demo's ZooKeeper's tickTime: sessions (LOCK_TTL for
// zk-lock) may last from 2 to 20 ticks, 1 s to 10 s.
const zkTick = 500 * time.Millisecond

// startZooKeeper starts a standalone ZooKeeper on a free loopback port,
// its configuration and data in dir/zookeeper, and waits until it answers
// ruok with imok and serves (zkOK).
func startZooKeeper(ctx context.Context, dir string) (*coordServer, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("java is not installed (make services installs ZooKeeper with it): %w", err)
	}
	if _, err := os.Stat(zkJars.server); err != nil {
		return nil, fmt.Errorf("ZooKeeper is not installed (make services installs zookeeperd): %w", err)
	}
	conf := filepath.Join(dir, "zookeeper")
	if err := os.MkdirAll(filepath.Join(conf, "data"), 0o755); err != nil {
		return nil, err
	}
	// The configuration folder comes first, for its log4j.properties.
	cp := []string{conf, zkJars.server}
	for _, jar := range zkJars.logging {
		if _, err := os.Stat(jar); err == nil {
			cp = append(cp, jar)
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cfg := fmt.Sprintf(`tickTime=%d
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
`, zkTick.Milliseconds(), filepath.Join(conf, "data"), port)
	const log4j = `log4j.rootLogger=WARN, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1}: %m%n
`
	if err := os.WriteFile(filepath.Join(conf, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(conf, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		return nil, err
	}
	// Without the heap flags the JVM grows to some 600 MB.
	p, err := startProcess("zookeeper "+addr, java, []string{
		"-Xms16m", "-Xmx64m", "-XX:+UseSerialGC", "-Dzookeeper.jmx.log4j.disable=true",
		"-cp", strings.Join(cp, ":"),
		"org.apache.zookeeper.server.ZooKeeperServerMain", filepath.Join(conf, "zoo.cfg"),
	}, os.Environ(), filepath.Join(dir, "zookeeper.log"))
	if err != nil {
		return nil, err
	}
	s := &coordServer{proc: p, addr: addr, data: filepath.Join(conf, "data")}
	// A JVM on two busy cores can take several seconds.
	if err := waitUntil(ctx, p, 60*time.Second, func() error { return zkOK(addr) }); err != nil {
		s.stop()
		return nil, fmt.Errorf("ZooKeeper at %s: %w", addr, err)
	}
	return s, nil
}

// zkOK sends ruok and expects imok, then srvr and expects a mode: imok
// only says the process runs, and for a moment after it a starting server
// answers srvr with "not currently serving requests".
func zkOK(addr string) error {
	answer, err := fourLetter(addr, "ruok")
	if err != nil {
		return err
	}
	if answer != "imok" {
		return fmt.Errorf("answered %q to ruok", answer)
	}
	if answer, err = fourLetter(addr, "srvr"); err != nil {
		return err
	}
	if !strings.Contains(answer, "Mode: ") {
		return fmt.Errorf("answered %q to srvr", answer)
	}
	return nil
}

// fourLetter sends one of ZooKeeper's four-letter commands and returns the
// answer (the server closes the connection after it).
func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(io.LimitReader(c, 1<<16))
	return strings.TrimSpace(string(b)), err
}

// waitUntil calls check every 100 ms until it returns nil, the process
// exits, or timeout passes; the error says which, with the last check's.
func waitUntil(ctx context.Context, p *process, timeout time.Duration, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("%w:\n%s", p.exitErr(), p.tail(5))
		case <-ctx.Done():
			return fmt.Errorf("does not answer after %s (%v): %w\n%s", timeout, err, ctx.Err(), p.tail(5))
		case <-tick.C:
		}
	}
}

// redisCLI is where Debian's redis-tools package puts redis-cli, which
// creates a cluster.
const redisCLI = "/usr/bin/redis-cli"

// startRedisCluster starts a Redis Cluster of n masters without replicas,
// each as durable as redis-reserve's one Redis (an append-only file fsynced
// before every answer, noeviction), on free loopback ports whose cluster
// bus ports (port + 10000) are free too, each in a folder of its own under
// dir/redis-cluster; it waits until every master serves every slot.
func startRedisCluster(ctx context.Context, dir string, n int) (*redisNodes, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not installed (make services installs it): %w", err)
	}
	if _, err := os.Stat(redisCLI); err != nil {
		return nil, fmt.Errorf("redis-cli is not installed (Debian's redis-tools): %w", err)
	}
	dir = filepath.Join(dir, "redis-cluster")
	r := &redisNodes{}
	for i := range n {
		port, err := clusterPort()
		if err != nil {
			r.stop()
			return nil, err
		}
		node := filepath.Join(dir, fmt.Sprintf("node-%d", i+1))
		if err := os.MkdirAll(node, 0o755); err != nil {
			r.stop()
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		p, err := startProcess("redis cluster node "+addr, bin, []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--daemonize", "no", "--dir", node,
			"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
			"--cluster-require-full-coverage", "no",
		}, os.Environ(), filepath.Join(dir, fmt.Sprintf("node-%d.log", i+1)))
		if err != nil {
			r.stop()
			return nil, err
		}
		r.procs = append(r.procs, p)
		r.addrs = append(r.addrs, addr)
		r.data = append(r.data, node)
	}
	for i, addr := range r.addrs {
		if err := waitRedis(ctx, addr, r.procs[i], 10*time.Second); err != nil {
			r.stop()
			return nil, err
		}
	}
	createCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, r.addrs...)
	out, err := exec.CommandContext(createCtx, redisCLI, append(args, "--cluster-replicas", "0", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		r.stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	// The masters learn of each other by gossip: poll each until it
	// knows all of them and every slot is served.
	for i, addr := range r.addrs {
		if err := waitUntil(ctx, r.procs[i], 30*time.Second, func() error { return clusterOK(ctx, addr, n) }); err != nil {
			r.stop()
			return nil, fmt.Errorf("redis cluster node %s: %w", addr, err)
		}
	}
	return r, nil
}

// clusterOK asks a cluster node for CLUSTER INFO and expects the cluster
// to be ok, with every master known and every slot served.
func clusterOK(ctx context.Context, addr string, masters int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return err
	}
	for _, want := range []string{"cluster_state:ok", "cluster_known_nodes:" + strconv.Itoa(masters), "cluster_slots_ok:16384"} {
		if !strings.Contains(info, want) {
			return fmt.Errorf("CLUSTER INFO lacks %s", want)
		}
	}
	return nil
}

// clusterPort returns a free port whose cluster bus port (port + 10000) is
// free too.
func clusterPort() (int, error) {
	for range 50 {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		if port+10000 > 65535 {
			continue
		}
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+10000)); err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, errors.New("no free port with a free cluster bus port (+10000) in 50 tries")
}
