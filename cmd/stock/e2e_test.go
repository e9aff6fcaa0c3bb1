package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testetcd"
	"github.com/flashsale/stock/lab/testredis"
	"github.com/flashsale/stock/lab/testzk"
)

// binary builds the service once per test run, without the race detector, so
// that the load below measures the service and not the detector.
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "stock-e2e-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "stock")
	out, err := exec.Command("go", "build", "-o", path, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
})

func buildBinary(t *testing.T) string {
	t.Helper()
	path, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// e2eAdminToken is the admin token of the instances the tests start.
const e2eAdminToken = "e2e-admin-token-0123"

// process is one running instance of the binary.
type process struct {
	url    string
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	exited chan error
}

// startInstance runs the binary with env and waits until /readyz answers
// 200; the process is stopped (by its own PID) when the test ends.
func startInstance(t *testing.T, env ...string) *process {
	t.Helper()
	return startCommand(t, exec.Command(buildBinary(t)), env...)
}

// startCommand is startInstance for a command that runs the binary in its
// own process (a shell that sets a limit, then execs it).
func startCommand(t *testing.T, cmd *exec.Cmd, env ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	cmd.Env = append(os.Environ(), append([]string{"HTTP_ADDR=" + addr, "ADMIN_TOKEN=" + e2eAdminToken, "LOG_LEVEL=warn"}, env...)...)
	p := &process{url: "http://" + addr, cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case a test left it frozen
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-p.exited:
			t.Fatalf("instance exited before it was ready: %v\n%s", err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance not ready after 30s\n%s", p.stderr)
		}
		// Polling a process that is starting: nothing to wait on but time.
		time.Sleep(50 * time.Millisecond)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func adminJSON(t *testing.T, method, url, body string, into any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, raw)
	}
	if into != nil {
		if err := json.Unmarshal(raw, into); err != nil {
			t.Fatal(err)
		}
	}
}

type auditBody struct {
	Initial, Available, Ordered, Orders int64
	Consistent                          bool
}

// TestBurstAcrossThreeInstances: three instances of the binary on one
// database take a burst of 2,000 concurrent orders for 500 units. Every safe
// strategy sells exactly the stock; naive, with its race window, oversells.
func TestBurstAcrossThreeInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	const units, buyers = 500, 2000
	redisAddrs := startRedisServers(t, 5)
	// redis-reserve refuses a Redis that could lose an accepted order.
	durableRedis := testredis.StartDurable(t).Addr
	coordination := coordinationEnv(t)
	type burstCase struct {
		name, strategy string
		env            []string
	}
	var cases []burstCase
	for _, strategy := range strategies.Names() {
		if strategy == strategies.NameLegacyGetset {
			// A control whose failure needs a pause, a skewed clock or
			// a late release (TestFencingDemonstration): a burst shows
			// only how slowly it polls.
			continue
		}
		cases = append(cases, burstCase{strategy, strategy, nil})
	}
	// The admission semaphore in front of a SQL strategy, across the three.
	cases = append(cases, burstCase{"conditional+admission", strategies.NameConditional, []string{"ADMISSION_LIMIT=2"}})
	for _, engine := range store.Engines {
		for _, c := range cases {
			strategy := c.strategy
			t.Run(engine+"/"+c.name, func(t *testing.T) {
				url := testdb.URL(t, engine)
				// Deadlines a loaded 2-core machine cannot reach: the test
				// is about selling exactly, and no buyer turned away.
				env := append([]string{"DATABASE_URL=" + url, "STRATEGY=" + strategy, "DB_MAX_CONNS=10", "ORDER_TIMEOUT=25s",
					"REDIS_ADDRS=" + redisAddrs, "LOCK_WAIT=25s"}, slices.Concat(coordination, c.env)...)
				if strategy == strategies.NameNaive {
					env = append(env, "NAIVE_RACE_WINDOW=5ms")
				}
				if slices.Contains(strategies.ReservedNames, strategy) {
					env = append(env, "REDIS_ADDRS="+durableRedis)
				}
				var instances []*process
				for range 3 {
					instances = append(instances, startInstance(t, env...))
				}
				adminJSON(t, http.MethodPut, instances[0].url+"/admin/stock/burst", fmt.Sprintf(`{"available":%d}`, units), nil)

				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: buyers, MaxConnsPerHost: 0}, Timeout: 60 * time.Second}
				statuses := make([]int, buyers)
				errs := make([]error, buyers)
				var wg, connected sync.WaitGroup
				start := make(chan struct{})
				for i := range buyers {
					wg.Add(1)
					connected.Add(1)
					go func() {
						defer wg.Done()
						// Each buyer opens its connection first (kept alive
						// for its order): 2,000 dials at once under the race
						// detector can leave a request unwritten past the
						// server's 5 s header deadline, and that measures
						// the test's client, not the service.
						if resp, err := client.Get(instances[i%3].url + "/healthz"); err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						connected.Done()
						<-start
						// A buyer whose answer is lost in transit retries
						// once with the same Idempotency-Key, as the contract
						// tells clients to: the retry returns the first
						// attempt's order if there was one, so the counts
						// below stay exact.
						body := fmt.Sprintf(`{"sku":"burst","quantity":1,"user_id":"u-%d"}`, i)
						var firstErr error
						for attempt := range 2 {
							req, _ := http.NewRequest(http.MethodPost, instances[i%3].url+"/orders", strings.NewReader(body))
							req.Header.Set("Content-Type", "application/json")
							req.Header.Set("Idempotency-Key", fmt.Sprintf("burst-%d", i))
							resp, err := client.Do(req)
							if err != nil {
								if attempt == 0 {
									firstErr = err
									continue
								}
								errs[i] = fmt.Errorf("%w (first attempt: %v)", err, firstErr)
								return
							}
							_, _ = io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							statuses[i] = resp.StatusCode
							return
						}
					}()
				}
				connected.Wait()
				began := time.Now()
				close(start)
				wg.Wait()
				elapsed := time.Since(began)
				// Connections dialled but never used would hold each
				// instance's graceful shutdown for 5s.
				client.CloseIdleConnections()

				counts := map[int]int64{}
				for i, s := range statuses {
					if errs[i] != nil {
						t.Errorf("buyer %d: %v", i, errs[i])
					}
					counts[s]++
				}
				var a auditBody
				adminJSON(t, http.MethodGet, instances[1].url+"/admin/audit/burst", "", &a)
				t.Logf("%d buyers in %v: statuses %v; audit %+v", buyers, elapsed.Round(time.Millisecond), counts, a)

				if a.Orders != counts[http.StatusCreated] {
					t.Errorf("%d answers were 201, the database has %d orders", counts[http.StatusCreated], a.Orders)
				}
				if a.Initial != a.Available+a.Ordered {
					t.Errorf("not conserved: %+v", a)
				}
				if strategy == strategies.NameNaive {
					if a.Available >= 0 {
						t.Errorf("naive with a 5ms race window across three instances should oversell; available %d", a.Available)
					}
					return
				}
				if a.Available != 0 || a.Ordered != units || !a.Consistent {
					t.Errorf("want exactly %d units sold and none left, audit %+v", units, a)
				}
				if other := int64(buyers) - counts[http.StatusCreated] - counts[http.StatusConflict]; other != 0 {
					t.Errorf("%d answers were neither 201 nor 409: %v", other, counts)
				}
				if slices.Contains(strategies.ReservedNames, strategy) {
					written := waitDrained(t, instances[2].url, engine, url, "burst")
					if written.Orders != counts[http.StatusCreated] || written.Available != 0 || !written.Consistent() {
						t.Errorf("after the drain the database has %+v, want the %d orders answered 201", written, counts[http.StatusCreated])
					}
				}
			})
		}
	}
}

// waitDrained waits until the audit of sku reports no order pending (every
// accepted order written by the instances' consumers), then returns the
// database's own audit.
func waitDrained(t *testing.T, instanceURL, engine, databaseURL, sku string) inventory.Audit {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var a struct{ Pending int64 }
		adminJSON(t, http.MethodGet, instanceURL+"/admin/audit/"+sku, "", &a)
		if a.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d orders still pending after 30s", a.Pending)
		}
		// Another process's consumers drain the stream: the audit is the
		// only signal there is, so poll it.
		time.Sleep(20 * time.Millisecond)
	}
	db, err := store.Open(context.Background(), databaseURL, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	written, err := db.Audit(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return written
}

// coordinationEnv starts the coordination services the lock strategies
// need (a private etcd, a private ZooKeeper) and returns the variables that
// point the service at them.
func coordinationEnv(t *testing.T) []string {
	t.Helper()
	return []string{
		"ETCD_ENDPOINTS=" + strings.Join(testetcd.Start(t).Endpoints(), ","),
		"ZK_SERVERS=" + testzk.Start(t).Addr,
	}
}

// startRedisServers starts n redis-servers for the test and returns their
// addresses as REDIS_ADDRS wants them.
func startRedisServers(t *testing.T, n int) string {
	t.Helper()
	var addrs []string
	for range n {
		addrs = append(addrs, testredis.Start(t).Addr)
	}
	return strings.Join(addrs, ",")
}

// TestFencingDemonstration: a lock holder's process freezes between its read
// and its write (FREEZE_HOLDER: SIGSTOP to itself, watchdog included) for
// longer than its lock lives; a second instance takes the lock and sells the
// last unit; then the first is resumed and writes. With fencing its write is
// refused and the stock is exact; with FENCING=off the oversell is there to
// see.
func TestFencingDemonstration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real service processes")
	}
	coordination := coordinationEnv(t)
	type demo struct{ strategy, fencing string }
	var demos []demo
	for _, strategy := range strategies.LockNames {
		demos = append(demos, demo{strategy, "on"}, demo{strategy, "off"})
	}
	// The classic SETNX + GETSET lock of older Redis articles has no token to fence with: the
	// frozen holder's late write goes through, as with FENCING=off.
	demos = append(demos, demo{strategies.NameLegacyGetset, "off"})
	for _, d := range demos {
		strategy, fencing := d.strategy, d.fencing
		t.Run(strategy+"/fencing-"+fencing, func(t *testing.T) {
			servers := 1
			if strategy == strategies.NameRedlock {
				servers = 3
			}
			redisAddrs := startRedisServers(t, servers)
			// The lock must expire while its holder is stopped: the
			// coordination services' shortest leases and sessions are
			// a second.
			ttl := "300ms"
			if strategy == strategies.NameEtcdLock || strategy == strategies.NameZKLock {
				ttl = "1s"
			}
			common := append([]string{"DATABASE_URL=" + testdb.URL(t, "postgres"), "STRATEGY=" + strategy,
				"REDIS_ADDRS=" + redisAddrs, "FENCING=" + fencing, "LOCK_TTL=" + ttl, "LOCK_WAIT=5s", "ORDER_TIMEOUT=10s"}, coordination...)
			paused := startInstance(t, append(common, "FREEZE_HOLDER=true")...)
			other := startInstance(t, common...)
			adminJSON(t, http.MethodPut, paused.url+"/admin/stock/last-one", `{"available":1}`, nil)

			type answer struct {
				status int
				err    error
			}
			pausedAnswer := make(chan answer, 1)
			go func() {
				status, err := postOrder(paused.url, "last-one", "slow-buyer")
				pausedAnswer <- answer{status, err}
			}()
			// Wait until the holder's process is stopped: it has read
			// "1 available" and holds the lock.
			waitStopped(t, paused.cmd.Process.Pid)

			// The other instance waits out the lock's TTL, takes it, sells.
			status, err := postOrder(other.url, "last-one", "fast-buyer")
			if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if err != nil || status != http.StatusCreated {
				t.Fatalf("second instance: %d %v, want 201\nits log:\n%s\nthe frozen one's log:\n%s", status, err, other.stderr, paused.stderr)
			}
			late := <-pausedAnswer
			t.Logf("the frozen holder's answer: %d %v", late.status, late.err)
			var a auditBody
			adminJSON(t, http.MethodGet, other.url+"/admin/audit/last-one", "", &a)
			t.Logf("paused holder answered %d; audit %+v", late.status, a)
			if fencing == "on" {
				if late.status != http.StatusServiceUnavailable {
					t.Errorf("the paused holder's late write answered %d, want 503", late.status)
				}
				if a.Available != 0 || a.Orders != 1 || !a.Consistent {
					t.Errorf("with fencing the stock must be exact: %+v", a)
				}
				if !strings.Contains(metricsText(t, paused.url), "stock_fenced_off_writes_total{strategy=\""+strategy+"\"} 1") {
					t.Error("the fenced-off write is not in /metrics")
				}
				return
			}
			if late.status != http.StatusCreated || a.Available != -1 || a.Orders != 2 {
				t.Errorf("FENCING=off should show the oversell (201, available -1, 2 orders); got %d and %+v", late.status, a)
			}
		})
	}
}

// waitStopped waits until the process with pid is in the stopped state.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// The state follows the parenthesised command name.
		if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 0 && f[0] == "T" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder never froze")
		}
		time.Sleep(5 * time.Millisecond) // polling the process state: there is no event to wait on
	}
}

// postOrder places an order for one unit; a non-201 answer comes back as an
// error that quotes the body.
func postOrder(base, sku, user string) (int, error) {
	body := fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":%q}`, sku, user)
	resp, err := http.Post(base+"/orders", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, fmt.Errorf("%d %s", resp.StatusCode, answer)
	}
	return resp.StatusCode, nil
}

func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestConfigurationErrors: the binary refuses bad configuration with one
// line that says what to fix.
func TestConfigurationErrors(t *testing.T) {
	cases := []struct {
		env  []string
		want []string
	}{
		{[]string{"STRATEGY=optimistic", "DATABASE_URL=postgres://127.0.0.1/x"}, []string{`STRATEGY="optimistic" is unknown`, "naive, for-update, version-cas, conditional"}},
		{[]string{"DATABASE_URL="}, []string{"DATABASE_URL is required"}},
		{[]string{"DATABASE_URL=sqlite:///tmp/x"}, []string{`scheme "sqlite"`}},
		{[]string{"DATABASE_URL=postgres://127.0.0.1/x", "ORDER_TIMEOUT=soon"}, []string{`ORDER_TIMEOUT="soon"`}},
		{[]string{"DATABASE_URL=postgres://127.0.0.1/x", "ADMIN_TOKEN=change-me"}, []string{"ADMIN_TOKEN must be at least 16 characters"}},
		{[]string{"DATABASE_URL=postgres://postgres@127.0.0.1:1/x?connect_timeout=2"}, []string{"cannot reach 127.0.0.1:1"}},
		{[]string{"DATABASE_URL=mysql://root@127.0.0.1:1/x?timeout=2s"}, []string{"cannot reach 127.0.0.1:1"}},
	}
	for _, c := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, buildBinary(t))
		cmd.Env = append(os.Environ(), append([]string{"HTTP_ADDR=127.0.0.1:0", "STRATEGY=", "DATABASE_URL="}, c.env...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		if err == nil {
			t.Errorf("%v: started, want a refusal", c.env)
			continue
		}
		last := strings.TrimSpace(stderr.String())
		if i := strings.LastIndex(last, "\n"); i >= 0 {
			last = last[i+1:]
		}
		for _, w := range c.want {
			if !strings.Contains(last, w) {
				t.Errorf("%v: last line %q does not say %q", c.env, last, w)
			}
		}
	}
}
