package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/connlimit"
	"github.com/flashsale/stock/lab/testdb"
)

// connsWait bounds each step of the connection tests: on 127.0.0.1 each
// takes milliseconds, so reaching it means the instance stopped answering.
const connsWait = 10 * time.Second

// TestBuyerAnsweredPastThousandsOfIdleConnections is the flood at a
// smaller scale: the instance may open 1,024 descriptors (so HTTP_MAX_CONNS
// defaults to 512), and one client opens 3,000 connections that each send
// GET /healthz and stay open. Without the cap the instance ran out of
// descriptors (accept4: too many open files) and buyers got no answer;
// with it the longest-idle connections make room, a buyer's order and the
// probe are answered at once, and the cap is logged once.
func TestBuyerAnsweredPastThousandsOfIdleConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real service process")
	}
	const descriptors, held = 1024, 3000
	wantCap := defaultHTTPMaxConns(descriptors, 16)
	ensureDescriptors(t, held+512)
	url := testdb.URL(t, "postgres")
	// The shell lowers the hard limit too, so the binary's Go runtime
	// cannot raise it again; exec keeps the PID the test stops.
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`ulimit -n %d && exec "$0"`, descriptors), buildBinary(t))
	// The idle timeout must not do the cap's work during the test.
	p := startCommand(t, cmd, "DATABASE_URL="+url, "STRATEGY=conditional", "HTTP_IDLE_TIMEOUT=1m")
	adminJSON(t, http.MethodPut, p.url+"/admin/stock/flood", `{"available":5}`, nil)

	began := time.Now()
	conns, answered, cut := holdIdleConnections(t, strings.TrimPrefix(p.url, "http://"), held)
	opened := time.Since(began)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()

	status, orderTook := timedRequest(t, http.MethodPost, p.url+"/orders", `{"sku":"flood","quantity":1,"user_id":"buyer"}`)
	if status != http.StatusCreated && status != http.StatusConflict {
		t.Errorf("the buyer's order: %d, want 201 (or a clear 409)", status)
	}
	if orderTook > 2*time.Second {
		t.Errorf("the buyer's order took %s, want an answer within 2s", orderTook)
	}
	healthStatus, healthTook := timedRequest(t, http.MethodGet, p.url+"/healthz", "")
	if healthStatus != http.StatusOK {
		t.Errorf("/healthz: %d", healthStatus)
	}
	t.Logf("%d connections from one client in %s (%d answered 200, %d closed at once); then the buyer's order was answered %d in %s, /healthz %d in %s",
		len(conns), opened.Round(time.Millisecond), answered, cut, status, orderTook.Round(time.Millisecond), healthStatus, healthTook.Round(time.Millisecond))

	metrics := fetchMetrics(t, p.url)
	evicted := metricOf(t, metrics, "stock_http_connections_evicted_total")
	operatorOnly := metricOf(t, metrics, `stock_http_connections_refused_total{how="operator_only"}`)
	open := metricOf(t, metrics, "stock_http_connections_open")
	t.Logf("stock_http_connections_evicted_total %v, refused operator_only %v, open %v (cap %d)", evicted, operatorOnly, open, wantCap)
	// Every connection answered as usual past the cap took an idle one's
	// place.
	if want := float64(held-cut-wantCap) - operatorOnly; evicted < want {
		t.Errorf("%v connections evicted, want at least %v: the cap is not %d", evicted, want, wantCap)
	}
	if open > float64(wantCap+connlimit.DefaultHeadroom) {
		t.Errorf("%v connections open, over the cap of %d and its headroom", open, wantCap)
	}
	logged := p.log()
	if n := strings.Count(logged, "connection cap reached"); n != 1 {
		t.Errorf("%d log lines about the cap, want 1", n)
	}
	if !strings.Contains(logged, fmt.Sprintf(`"max_conns":%d`, wantCap)) {
		t.Errorf("the log does not give the cap %d:\n%s", wantCap, logged)
	}
	if strings.Contains(logged, "too many open files") {
		t.Errorf("the instance ran out of descriptors:\n%s", logged)
	}
}

// TestProbesAnsweredWhenNoConnectionIsIdle: with HTTP_MAX_CONNS
// connections held that have sent nothing yet (none idle, so none to
// evict), a buyer gets 503 too_many_connections and its connection closed,
// while /healthz and /readyz still answer 200 for the operator.
func TestProbesAnsweredWhenNoConnectionIsIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real service process")
	}
	const maxConns = 20
	url := testdb.URL(t, "postgres")
	p := startInstance(t, "DATABASE_URL="+url, "STRATEGY=conditional", "HTTP_MAX_CONNS="+strconv.Itoa(maxConns))
	adminJSON(t, http.MethodPut, p.url+"/admin/stock/held", `{"available":5}`, nil)
	for range maxConns {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.url, "http://"), connsWait)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// The instance accepts connections in the order they were made: the
	// requests below come after the silent ones, which the server's
	// ReadHeaderTimeout (5s) would only cut later.
	resp, body := request(t, http.MethodPost, p.url+"/orders", `{"sku":"held","quantity":1,"user_id":"buyer"}`)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"too_many_connections"`) ||
		resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Errorf("a buyer while the cap is held: %d %s (Retry-After %q, closed %v), want 503 too_many_connections with Retry-After, closing",
			resp.StatusCode, body, resp.Header.Get("Retry-After"), resp.Close)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, body := request(t, http.MethodGet, p.url+path, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("%s while the cap is held: %d %s", path, resp.StatusCode, body)
		}
	}
	// The admin routes are over the cap too: ask the database.
	if rows := tableRows(t, url); rows[1] != 0 {
		t.Errorf("the refused order left %d order rows", rows[1])
	}
}

// holdIdleConnections opens n connections to addr, 16 at a time, each
// sending GET /healthz and reading its answer, and returns them open. It
// counts the answers 200 and the connections closed before any answer
// (beyond the headroom, when many arrive at once).
func holdIdleConnections(t *testing.T, addr string, n int) (conns []net.Conn, answered, cut int) {
	t.Helper()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for range next {
				c, status, err := healthzAndStay(addr)
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case status == http.StatusOK:
					answered++
				case status == 0:
					cut++
				default:
					errs = append(errs, fmt.Errorf("GET /healthz: %d", status))
				}
				if c != nil {
					conns = append(conns, c)
				}
				mu.Unlock()
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	for _, err := range errs[:min(len(errs), 5)] {
		t.Error(err)
	}
	if len(errs) > 0 {
		t.Fatalf("%d of %d connections failed", len(errs), n)
	}
	return conns, answered, cut
}

// healthzAndStay dials addr, sends GET /healthz and reads the answer,
// leaving the connection open; status 0 is a connection the server closed
// before answering.
func healthzAndStay(addr string) (net.Conn, int, error) {
	c, err := net.DialTimeout("tcp", addr, connsWait)
	if err != nil {
		return nil, 0, err
	}
	_ = c.SetDeadline(time.Now().Add(connsWait))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return c, 0, nil // closed at once, before the request went out
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		var netErr net.Error
		if errors.As(err, &netErr) && netErr.Timeout() {
			return c, 0, fmt.Errorf("GET /healthz: no answer in %s", connsWait)
		}
		return c, 0, nil // closed before answering
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode, nil
}

// request sends one request on a connection of its own, as a new client
// would, and returns the answer and its body.
func request(t *testing.T, method, url, body string) (*http.Response, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{}, Timeout: connsWait}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(raw)
}

// timedRequest is request, timed from the dial to the whole answer.
func timedRequest(t *testing.T, method, url, body string) (int, time.Duration) {
	t.Helper()
	began := time.Now()
	resp, _ := request(t, method, url, body)
	return resp.StatusCode, time.Since(began)
}

func fetchMetrics(t *testing.T, base string) string {
	t.Helper()
	resp, body := request(t, http.MethodGet, base+"/metrics", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	return body
}

// metricOf reads one series of a /metrics text (0 when absent).
func metricOf(t *testing.T, text, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// log returns what the process has written to its stderr so far.
func (p *process) log() string {
	w := p.cmd.Stderr.(*lockedWriter)
	w.mu.Lock()
	defer w.mu.Unlock()
	return p.stderr.String()
}

// ensureDescriptors makes sure this test process may open n descriptors:
// Go raised the soft limit to the hard one at start, so only a hard limit
// below n fails the test.
func ensureDescriptors(t *testing.T, n uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= n {
		return
	}
	if lim.Max < n {
		t.Fatalf("the test holds %d connections, and RLIMIT_NOFILE allows this process %d (hard limit %d)", n, lim.Cur, lim.Max)
	}
	lim.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
}
