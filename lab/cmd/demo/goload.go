package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// The second load generator: a small Go client, so that a reader sees
// whether k6 or the service bounds a figure. Each worker keeps one HTTP/1.1
// keep-alive connection per instance and sends its requests one after the
// other, round robin over the instances, like k6's VUs. It talks only to
// the fleet's 127.0.0.1 addresses, and every load it sends is bounded (a
// duration, or a number of buyers under a deadline) and stops by itself.

// goClient is an HTTP/1.1 client with a keep-alive connection per worker and
// instance.
func goClient(workers, instances int) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        workers * instances,
		MaxIdleConnsPerHost: workers,
		IdleConnTimeout:     30 * time.Second,
		ForceAttemptHTTP2:   false,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// latencies collects request latencies from many workers.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d []time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[(len(l.d)*99)/100]
}

// goHealthz runs workers against GET /healthz of urls for d: the Go
// client's ceiling on this machine.
func goHealthz(ctx context.Context, urls []string, workers int, d time.Duration) report.GoLoadGen {
	res := report.GoLoadGen{Workers: workers, Duration: d}
	client := goClient(workers, len(urls))
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var total, failed atomic.Int64
	var lat latencies
	var wg sync.WaitGroup
	began := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for i := w; ctx.Err() == nil; i++ {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[i%len(urls)]+"/healthz", nil)
				t := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					continue
				}
				mine = append(mine, time.Since(t))
				total.Add(1)
			}
			lat.add(mine)
		})
	}
	wg.Wait()
	elapsed := time.Since(began)
	res.Requests = total.Load()
	res.RequestsPerSec = float64(res.Requests) / elapsed.Seconds()
	res.P99 = lat.p99()
	if n := failed.Load(); n > 0 {
		res.Error = fmt.Sprintf("%d requests failed", n)
	}
	return res
}

// healthzBeside sends n GET /healthz from workers workers over urls, on
// client (connected already), and returns what they cost, by meter: the
// baseline of an order run on the same instances, measured the same way
// right beside it (before it, or after a burst, whose sale starts cold). A request's CPU depends on more than its handler (the
// instances' count, the workers, the heap the instances carry by then),
// so a ratio to /healthz compares runs of the same shape.
func healthzBeside(ctx context.Context, client *http.Client, urls []string, workers, n int, meter *cpuMeter) *report.CPUCost {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var next, answered, failed atomic.Int64
	var wg sync.WaitGroup
	before := meter.sample(0, 0)
	for range workers {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n) && ctx.Err() == nil; i = next.Add(1) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[int(i)%len(urls)]+"/healthz", nil)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	note := fmt.Sprintf("%d GET /healthz from %d workers on the same instances, beside the orders", n, workers)
	if f := failed.Load(); f > 0 {
		note += fmt.Sprintf("; %d failed", f)
	}
	return meter.cost(before, meter.sample(answered.Load(), 0), note)
}

// goBurst starts a sale of g.Stock units of g.SKU and sends g.Buyers orders
// of one unit from g.Workers workers at once, round robin over urls, until
// every buyer has an answer or maxDuration passes.
func goBurst(ctx context.Context, urls []string, token string, g *report.GoBurst, maxDuration time.Duration) {
	client := goClient(g.Workers, len(urls))
	defer client.CloseIdleConnections()
	if err := startSale(ctx, client, urls[0], token, g.SKU, g.Stock); err != nil {
		g.Error = err.Error()
		return
	}
	if g.Warm {
		if err := warmUp(ctx, client, urls, g.Workers); err != nil {
			g.Error = err.Error()
			return
		}
	}
	goOrders(ctx, client, urls, g, maxDuration)
}

// warmUp opens every worker's keep-alive connection to every instance
// (GET /healthz, all at once), so that a burst's clock starts with the
// clients connected, as a sale's buyers are who sit on the page.
func warmUp(ctx context.Context, client *http.Client, urls []string, workers int) error {
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range workers {
		for _, u := range urls {
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"/healthz", nil)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("warming up: %d of %d connections failed", n, workers*len(urls))
	}
	return nil
}

// goOrders sends g.Buyers orders of one unit of g.SKU from g.Workers
// workers at once, round robin over urls, until every buyer has an answer
// or maxDuration passes, and fills g's counts, windows and latencies.
func goOrders(ctx context.Context, client *http.Client, urls []string, g *report.GoBurst, maxDuration time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, maxDuration)
	defer cancel()
	var next, orders, soldOut, other atomic.Int64
	var lastSold atomic.Int64 // nanoseconds since began
	var lat, latSold, latSoldOut latencies
	var wg sync.WaitGroup
	began := time.Now()
	for range g.Workers {
		wg.Go(func() {
			var mine, sold, refused []time.Duration
			for i := next.Add(1); i <= int64(g.Buyers) && ctx.Err() == nil; i = next.Add(1) {
				body := fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":"go-%d"}`, g.SKU, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, urls[int(i)%len(urls)]+"/orders", bytes.NewBufferString(body))
				req.Header.Set("Content-Type", "application/json")
				t := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took := time.Since(t)
				mine = append(mine, took)
				switch resp.StatusCode {
				case http.StatusCreated:
					orders.Add(1)
					sold = append(sold, took)
					at := int64(time.Since(began))
					for {
						old := lastSold.Load()
						if at <= old || lastSold.CompareAndSwap(old, at) {
							break
						}
					}
				case http.StatusConflict:
					soldOut.Add(1)
					refused = append(refused, took)
				default:
					other.Add(1)
				}
			}
			lat.add(mine)
			latSold.add(sold)
			latSoldOut.add(refused)
		})
	}
	wg.Wait()
	g.Duration = time.Since(began)
	g.Orders, g.SoldOut, g.Other = orders.Load(), soldOut.Load(), other.Load()
	g.SellWindow = time.Duration(lastSold.Load())
	if g.SellWindow >= 10*time.Millisecond {
		g.OrdersPerSec = float64(g.Orders) / g.SellWindow.Seconds()
	}
	g.P99, g.P99Sold, g.P99SoldOut = lat.p99(), latSold.p99(), latSoldOut.p99()
	if answered := g.Orders + g.SoldOut + g.Other; answered < int64(g.Buyers) {
		g.Error = fmt.Sprintf("only %d of %d buyers were answered within %s", answered, g.Buyers, maxDuration)
	}
}

// startSale is PUT /admin/stock/{sku}.
func startSale(ctx context.Context, client *http.Client, url, token, sku string, stock int64) error {
	body := bytes.NewBufferString(`{"available":` + strconv.FormatInt(stock, 10) + `}`)
	return adminPut(ctx, client, url+"/admin/stock/"+sku, token, "", body, "starting the sale")
}

// startCatalog is PUT /admin/stock: every SKU of skus on sale with stock
// units, in one request, under the Idempotency-Key key.
func startCatalog(ctx context.Context, client *http.Client, url, token, key string, skus []string, stock int64) error {
	var body bytes.Buffer
	body.WriteByte('[')
	for i, sku := range skus {
		if i > 0 {
			body.WriteByte(',')
		}
		fmt.Fprintf(&body, `{"sku":%q,"available":%d}`, sku, stock)
	}
	body.WriteByte(']')
	return adminPut(ctx, client, url+"/admin/stock", token, key, &body, "putting the catalog on sale")
}

// adminPut sends an admin PUT of a JSON body (with an Idempotency-Key
// when key is not ""): nil on 200, errUnavailable on 503 (nothing done),
// what is doing in every error.
func adminPut(ctx context.Context, client *http.Client, target, token, key string, body io.Reader, what string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusServiceUnavailable:
		return fmt.Errorf("%s: %w %s", what, errUnavailable, answer)
	}
	return fmt.Errorf("%s: %s %s", what, resp.Status, answer)
}

// errUnavailable is a 503 answer: the service did nothing (a backend did
// not answer, or was out of connections), and an idempotent request may be
// sent again.
var errUnavailable = errors.New("503 Service Unavailable")

// catalogLoad is the catalog's orders: workers keep-alive workers, each
// ordering one unit at a time until duration has passed (an order in
// flight then still gets its answer, so that every 201 is counted), each
// order's SKU drawn from a Zipf distribution over the SKUs' ranks: rank k
// with probability ∝ (v+k)^−s. Each worker draws from its own generator,
// seeded with seed and its number, so a run's sequence of SKUs per worker
// is the same every time.
type catalogLoad struct {
	urls     []string
	skus     []string // by rank, the hottest first
	workers  int
	duration time.Duration
	s, v     float64
	seed     uint64
}

// catalogTally is what the Go client saw: per rank, the orders sent and
// the 201s; over all, the answers by status and the latencies.
type catalogTally struct {
	requests, created                     []atomic.Int64
	orders, soldOut, busy, other, answers atomic.Int64
	elapsed                               time.Duration
	lat                                   latencies
}

// goCatalog runs the catalog's load and returns its tally.
func goCatalog(ctx context.Context, l catalogLoad) *catalogTally {
	t := &catalogTally{requests: make([]atomic.Int64, len(l.skus)), created: make([]atomic.Int64, len(l.skus))}
	client := goClient(l.workers, len(l.urls))
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	began := time.Now()
	deadline := began.Add(l.duration)
	for w := range l.workers {
		wg.Go(func() {
			zipf := rand.NewZipf(rand.New(rand.NewPCG(l.seed, uint64(w))), l.s, l.v, uint64(len(l.skus)-1))
			var mine []time.Duration
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				rank := zipf.Uint64()
				body := fmt.Sprintf(`{"sku":%q,"quantity":1,"user_id":"cat-%d-%d"}`, l.skus[rank], w, i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, l.urls[(w+i)%len(l.urls)]+"/orders", bytes.NewBufferString(body))
				req.Header.Set("Content-Type", "application/json")
				t.requests[rank].Add(1)
				began := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					t.other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mine = append(mine, time.Since(began))
				switch resp.StatusCode {
				case http.StatusCreated:
					t.orders.Add(1)
					t.created[rank].Add(1)
				case http.StatusConflict:
					t.soldOut.Add(1)
				case http.StatusServiceUnavailable:
					t.busy.Add(1)
				default:
					t.other.Add(1)
				}
			}
			t.lat.add(mine)
		})
	}
	wg.Wait()
	t.elapsed = time.Since(began)
	t.answers.Store(t.orders.Load() + t.soldOut.Load() + t.busy.Load() + t.other.Load())
	return t
}

// quantile returns the latency at q (0.5, 0.99).
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0
	}
	slices.Sort(l.d)
	return l.d[min(len(l.d)-1, int(float64(len(l.d))*q))]
}
