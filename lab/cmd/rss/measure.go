package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

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
