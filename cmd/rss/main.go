// Command rss measures what a catalog costs the service's memory: for each
// strategy it starts one instance of the service (a built bin/stock) on
// 127.0.0.1 with a scratch PostgreSQL database and private lock servers of
// its own, reads the instance's resident memory once it is ready (VmRSS in
// /proc/PID/status), puts -skus SKUs on sale (PUT /admin/stock/{sku}) and
// places one order on each (POST /orders), and reads it again. It prints
// one Markdown row per strategy.
//
// With -idle it also measures what the catalog costs when nobody buys:
// after the load and -drain, the CPU time (user + system, utime + stime in
// /proc/PID/stat) the instance and the servers started for it spent over
// the -idle window, as a share of one core. Put more than one unit on
// sale per SKU (-units) so that the catalog stays on sale after its one
// order each.
//
//	go build -o /tmp/stock-rss ./cmd/stock
//	go run ./cmd/rss -bin /tmp/stock-rss -skus 100000
//	go run ./cmd/rss -bin /tmp/stock-rss -skus 10000 -units 20 -idle 60s -strategies redis-reserve,redis-watch
//
// Everything it talks to is on 127.0.0.1; it stops only the processes it
// started, by their PIDs, and drops only the databases it created. The
// count of SKUs and the time per strategy are bounded (-skus at most
// 1,000,000; -timeout).
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/testetcd"
	"github.com/flashsale/stock/internal/testredis"
	"github.com/flashsale/stock/internal/testzk"
)

// maxSKUs bounds -skus: the run must end.
const maxSKUs = 1_000_000

// adminToken is the instances' ADMIN_TOKEN.
const adminToken = "rss-admin-token-0123456789"

type options struct {
	bin        string
	skus       int
	units      int
	workers    int
	timeout    time.Duration
	settle     time.Duration
	linger     time.Duration
	drain      time.Duration
	idle       time.Duration
	postgres   string
	strategies []string
	env        []string
	keep       bool
}

func main() {
	var o options
	var strategies, env string
	flag.StringVar(&o.bin, "bin", "bin/stock", "the service's binary (go build -o ... ./cmd/stock)")
	flag.IntVar(&o.skus, "skus", 100_000, fmt.Sprintf("SKUs put on sale and ordered once each, per strategy (at most %d)", maxSKUs))
	flag.IntVar(&o.units, "units", 1, "units put on sale per SKU (each SKU is ordered once: more than 1 keeps it on sale)")
	flag.DurationVar(&o.idle, "idle", 0, "if set, the CPU the instance and its servers spend over this window once the load has ended and -drain passed")
	flag.DurationVar(&o.drain, "drain", 20*time.Second, "with -idle: wait this long after the load before the idle window (the orders reach the database)")
	flag.IntVar(&o.workers, "workers", 16, "concurrent HTTP clients")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "bound on one strategy's load")
	flag.DurationVar(&o.settle, "settle", 2*time.Second, "wait after /readyz before the idle reading")
	flag.DurationVar(&o.linger, "linger", 0, "if set, a third reading this long after the load, once the Go runtime "+
		"has collected (it forces a GC every 2 minutes) and returned memory: what stays")
	flag.StringVar(&o.postgres, "postgres", envOr("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL server (a scratch database is created on it per strategy and dropped after)")
	flag.StringVar(&strategies, "strategies", "", "comma-separated strategies (default: every one `bin strategies` lists, redis-reserve and redis-watch last)")
	flag.StringVar(&env, "env", "", "comma-separated NAME=value pairs for every instance (e.g. AUDIT_EVERY=0)")
	flag.BoolVar(&o.keep, "keep", false, "keep the instances' logs (their folder is printed)")
	flag.Parse()
	if o.skus < 1 || o.skus > maxSKUs || o.workers < 1 || o.workers > 256 || o.units < 1 || o.units > 1_000_000 {
		fmt.Fprintf(os.Stderr, "rss: -skus must be 1..%d, -units 1..1000000 and -workers 1..256\n", maxSKUs)
		os.Exit(2)
	}
	if err := loopback(o.postgres); err != nil {
		fmt.Fprintf(os.Stderr, "rss: -postgres: %v\n", err)
		os.Exit(2)
	}
	if env != "" {
		o.env = strings.Split(env, ",")
	}
	if strategies != "" {
		o.strategies = strings.Split(strategies, ",")
	} else {
		all, err := listStrategies(o.bin)
		if err != nil {
			fmt.Fprintf(os.Stderr, "rss: %v\n", err)
			os.Exit(1)
		}
		o.strategies = reservationLast(all)
	}
	// An interrupt ends the load; each strategy's deferred clean-up still
	// stops what it started and drops its database.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "rss: %v\n", err)
		os.Exit(1)
	}
}

// loopback refuses a server URL whose host is not on this machine: the
// run sends load only to 127.0.0.1.
func loopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (127.0.0.1)", u.Hostname())
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// listStrategies asks the binary for its STRATEGY values.
func listStrategies(bin string) ([]string, error) {
	out, err := exec.Command(bin, "strategies").Output()
	if err != nil {
		return nil, fmt.Errorf("%s strategies: %w", bin, err)
	}
	return strings.Fields(string(out)), nil
}

// reservationLast orders the reservation strategies after the others.
func reservationLast(all []string) []string {
	var rest, last []string
	for _, s := range all {
		if slices.Contains(inventory.ReservedStrategyNames, s) {
			last = append(last, s)
		} else {
			rest = append(rest, s)
		}
	}
	return append(rest, last...)
}

// result is one strategy's measurement.
type result struct {
	strategy                 string
	skus                     int
	idleRSS, afterRSS, peak  int64 // bytes
	idleHeap, afterHeap      int64 // go_memstats_heap_inuse_bytes
	goroutines               int64
	lingerRSS, lingerHeap    int64          // -linger after the load; 0 without it
	idleService, idleServers float64        // -idle: share of one core; -1 without it
	idleCalls                string         // -idle: the Redis commands per second in the window
	failed                   map[string]int // "PUT 503" → count
	took                     time.Duration
	err                      error
}

func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "stock-rss-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintf(os.Stderr, "logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	fmt.Printf("| strategy | SKUs | idle VmRSS | VmRSS after | growth | VmHWM | Go heap in use idle → after | goroutines after | failed requests | load | VmRSS, heap %s later | idle CPU over %s: instance, its servers |\n", o.linger, o.idle)
	fmt.Printf("|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|\n")
	var errs []error
	for _, s := range o.strategies {
		if ctx.Err() != nil {
			break
		}
		r := measure(ctx, o, s, filepath.Join(dir, s))
		if r.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s, r.err))
			fmt.Printf("| `%s` | failed: %v |\n", s, oneLine(r.err))
			continue
		}
		later := "–"
		if r.lingerRSS > 0 {
			later = mb(r.lingerRSS) + ", " + mb(r.lingerHeap)
		}
		idle := "–"
		if r.idleService >= 0 {
			idle = fmt.Sprintf("%.2f%%, %.2f%% of a core", 100*r.idleService, 100*r.idleServers)
			if r.idleCalls != "" {
				idle += " (Redis: " + r.idleCalls + ")"
			}
		}
		fmt.Printf("| `%s` | %d | %s | %s | %s | %s | %s → %s | %d | %s | %s | %s | %s |\n", s, r.skus,
			mb(r.idleRSS), mb(r.afterRSS), mb(r.afterRSS-r.idleRSS), mb(r.peak), mb(r.idleHeap), mb(r.afterHeap),
			r.goroutines, failures(r.failed), r.took.Round(time.Second), later, idle)
	}
	return errors.Join(errs...)
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func mb(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func failures(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// measure runs one strategy from a fresh database and fresh lock servers
// to its second reading, and stops everything it started.
func measure(ctx context.Context, o options, strategy, dir string) (r result) {
	r = result{strategy: strategy, skus: o.skus, failed: map[string]int{}, idleService: -1, idleServers: -1}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.err = err
		return r
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	dbURL, dropDB, err := scratchDatabase(ctx, o.postgres, strategy)
	if err != nil {
		r.err = err
		return r
	}
	defer dropDB()
	env, serverPIDs, redisAddrs, stopServers, err := lockServers(strategy, dir)
	if err != nil {
		r.err = err
		return r
	}
	defer stopServers()

	port, err := freePort()
	if err != nil {
		r.err = err
		return r
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	env = append(env, "STRATEGY="+strategy, "DATABASE_URL="+dbURL, "HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port),
		"ADMIN_TOKEN="+adminToken, "LOG_LEVEL=warn")
	env = append(env, o.env...)
	svc, err := startService(o.bin, env, filepath.Join(dir, "stock.log"))
	if err != nil {
		r.err = err
		return r
	}
	defer svc.stop()

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: o.workers, MaxConnsPerHost: o.workers,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}}
	defer client.CloseIdleConnections()
	if err := waitReady(ctx, client, base, svc); err != nil {
		r.err = err
		return r
	}
	pause(ctx, o.settle)
	if r.idleRSS, _, err = rss(svc.pid()); err != nil {
		r.err = err
		return r
	}
	r.idleHeap, _ = gauge(ctx, client, base, "go_memstats_heap_inuse_bytes")

	began := time.Now()
	r.failed, err = load(ctx, client, base, o.skus, o.units, o.workers)
	r.took = time.Since(began)
	if err != nil {
		r.err = fmt.Errorf("%w (log: %s)", err, svc.tail())
		return r
	}
	if r.afterRSS, r.peak, err = rss(svc.pid()); err != nil {
		r.err = err
		return r
	}
	r.afterHeap, _ = gauge(ctx, client, base, "go_memstats_heap_inuse_bytes")
	r.goroutines, _ = gauge(ctx, client, base, "go_goroutines")
	if o.linger > 0 {
		pause(ctx, o.linger)
		if r.lingerRSS, _, err = rss(svc.pid()); err != nil {
			r.err = err
			return r
		}
		r.lingerHeap, _ = gauge(ctx, client, base, "go_memstats_heap_inuse_bytes")
	}
	if o.idle > 0 {
		// Nothing of this run talks to the instance in the window: the
		// readings are /proc files, not requests.
		client.CloseIdleConnections()
		pause(ctx, o.drain)
		before := commandCalls(ctx, redisAddrs)
		if r.idleService, r.idleServers, err = idleCPU(ctx, svc.pid(), serverPIDs, o.idle); err != nil {
			r.err = err
			return r
		}
		r.idleCalls = callsPerSecond(before, commandCalls(ctx, redisAddrs), o.idle)
	}
	return r
}

// commandCalls sums each command's calls over the Redis servers (INFO
// commandstats): what the instance asked them, plus these INFO calls.
func commandCalls(ctx context.Context, addrs []string) map[string]int64 {
	calls := map[string]int64{}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
		info, err := c.Info(ctx, "commandstats").Result()
		_ = c.Close()
		if err != nil {
			continue
		}
		for line := range strings.Lines(info) {
			// cmdstat_xreadgroup:calls=12,usec=...
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
			if !ok {
				continue
			}
			n, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(n, 10, 64)
			if err == nil {
				calls[name] += v
			}
		}
	}
	return calls
}

// callsPerSecond is the commands called between two readings, per
// second, busiest first, without the readings' own INFO.
func callsPerSecond(before, after map[string]int64, window time.Duration) string {
	type rate struct {
		name string
		n    float64
	}
	var rates []rate
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" && name != "hello" && name != "client|setinfo" {
			rates = append(rates, rate{name, float64(d) / window.Seconds()})
		}
	}
	if len(rates) == 0 {
		return ""
	}
	slices.SortFunc(rates, func(a, b rate) int { return cmp.Compare(b.n, a.n) })
	var parts []string
	for _, r := range rates {
		parts = append(parts, fmt.Sprintf("%s %.1f/s", strings.ToUpper(r.name), r.n))
	}
	return strings.Join(parts, ", ")
}

// idleCPU is the CPU time the service and the servers spent over window,
// each as a share of one core.
func idleCPU(ctx context.Context, service int, servers []int, window time.Duration) (svc, srv float64, err error) {
	ticks := func() (s, v int64, err error) {
		if s, err = cpuTicks(service); err != nil {
			return 0, 0, err
		}
		for _, pid := range servers {
			t, err := cpuTicks(pid)
			if err != nil {
				return 0, 0, err
			}
			v += t
		}
		return s, v, nil
	}
	s0, v0, err := ticks()
	if err != nil {
		return 0, 0, err
	}
	began := time.Now()
	pause(ctx, window)
	if err := ctx.Err(); err != nil {
		return 0, 0, err
	}
	s1, v1, err := ticks()
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(began).Seconds() * clockTicks
	return float64(s1-s0) / elapsed, float64(v1-v0) / elapsed, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat:
// 100 on every Linux architecture Go builds for.
const clockTicks = 100

// cpuTicks is the process's user plus system time, all its threads, in
// clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return utime + stime, nil
}

// load puts skus SKUs on sale (units each) and orders each once, from
// workers goroutines. It returns the requests that failed, by method and
// status; an error if ctx ended first.
func load(ctx context.Context, client *http.Client, base string, skus, units, workers int) (map[string]int, error) {
	stock := `{"available":` + strconv.Itoa(units) + `}`
	var (
		next   atomic.Int64
		mu     sync.Mutex
		failed = map[string]int{}
		wg     sync.WaitGroup
	)
	fail := func(what string) {
		mu.Lock()
		failed[what]++
		mu.Unlock()
	}
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1)
				if i > int64(skus) {
					return
				}
				sku := "rss-" + strconv.FormatInt(i, 10)
				if st := send(ctx, client, http.MethodPut, base+"/admin/stock/"+sku, stock); st != http.StatusOK {
					fail(fmt.Sprintf("PUT %d", st))
					continue
				}
				body := `{"sku":"` + sku + `","quantity":1,"user_id":"rss"}`
				if st := send(ctx, client, http.MethodPost, base+"/orders", body); st != http.StatusCreated {
					fail(fmt.Sprintf("POST %d", st))
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return failed, fmt.Errorf("load cut short after %d of %d SKUs: %w", min(next.Load(), int64(skus)), skus, err)
	}
	return failed, nil
}

// send makes one request and returns its status (0: no answer).
func send(ctx context.Context, client *http.Client, method, url, body string) int {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// rss reads the process's resident set and its peak, in bytes.
func rss(pid int) (now, peak int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%s: %q: %w", name, value, err)
		}
		if name == "VmRSS" {
			now = kb << 10
		} else {
			peak = kb << 10
		}
	}
	if now == 0 {
		return 0, 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return now, peak, sc.Err()
}

// gauge reads one unlabelled sample of /metrics.
func gauge(ctx context.Context, client *http.Client, base, name string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return int64(f), err
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

func waitReady(ctx context.Context, client *http.Client, base string, svc *service) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		if send(ctx, client, http.MethodGet, base+"/readyz", "") == http.StatusOK {
			return nil
		}
		select {
		case <-svc.exited:
			return fmt.Errorf("the service exited: %s", svc.tail())
		case <-ctx.Done():
			return fmt.Errorf("not ready in 60s: %s", svc.tail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

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
	switch strategy {
	case inventory.NameRedisLock, inventory.NameLegacyGetset:
		addrs, err := redisServers(1)
		if err != nil {
			return nil, nil, nil, stop, err
		}
		env = append(env, "REDIS_ADDRS="+addrs[0])
	case inventory.NameRedlock:
		addrs, err := redisServers(5)
		if err != nil {
			return nil, nil, nil, stop, err
		}
		env = append(env, "REDIS_ADDRS="+strings.Join(addrs, ","))
	case inventory.NameRedisReserve, inventory.NameRedisWatch:
		addrs, err := redisServers(1, "--appendonly", "yes", "--appendfsync", "always")
		if err != nil {
			return nil, nil, nil, stop, err
		}
		env = append(env, "REDIS_ADDRS="+addrs[0])
	case inventory.NameEtcdLock:
		c, err := testetcd.Spawn(filepath.Join(dir, "etcd"), 1)
		if err != nil {
			return nil, nil, nil, stop, err
		}
		stops = append(stops, c.Stop)
		for _, m := range c.Members {
			pids = append(pids, m.PID())
		}
		env = append(env, "ETCD_ENDPOINTS="+strings.Join(c.Endpoints(), ","))
	case inventory.NameZKLock:
		// zk-lock keeps a folder and a fence node per SKU in ZooKeeper.
		s, err := testzk.SpawnSized(filepath.Join(dir, "zookeeper"), 0, "1g")
		if err != nil {
			return nil, nil, nil, stop, err
		}
		stops = append(stops, s.Stop)
		pids = append(pids, s.PID())
		env = append(env, "ZK_SERVERS="+s.Addr)
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
	"ZK_SERVERS", "LOG_LEVEL", "AUDIT_EVERY", "RESERVE_RECONCILE_EVERY", "ADMISSION_LIMIT"}

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
