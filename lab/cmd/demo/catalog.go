package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/lab/report"
)

// The catalog scenario: many SKUs on sale at once, a few of them hot. In
// round 1 of every strategy, on the instances of its other scenarios, it
// puts CATALOG_SKUS SKUs on sale (PUT /admin/stock, up to
// catalogRequestSKUs SKUs a request), sends the Go client's orders for CATALOG_DURATION with each
// order's SKU drawn from a Zipf distribution over the SKUs' ranks, and
// audits every SKU (GET /admin/audit/{sku}). redis-reserve and redis-watch
// run it once more on a Redis Cluster the demo starts.

// catalogRequestSKUs is the SKUs of one PUT /admin/stock: the service's
// most (inventory.MaxCatalogSKUs).
const catalogRequestSKUs = 10_000

// catalogSeed seeds the workers' generators: the same SKUs in the same
// order per worker in every run, so that strategies get the same orders.
const catalogSeed = 20261127

// catalogDrainTimeout bounds the wait for the orders of redis-reserve and
// redis-watch to reach the database before the audit counts them.
const catalogDrainTimeout = time.Minute

// adminAttempts bounds the tries of one set-up PUT or audit GET that the
// service answered 503 (nothing done: a backend was unavailable, e.g. out
// of connections on a database shared with other work). Both requests are
// idempotent: a PUT sets the same stock again before any order.
const adminAttempts = 4

// retryUnavailable calls fn until it returns anything but errUnavailable,
// at most adminAttempts times, waiting 100 ms more after each try; it
// returns the number of retries and fn's last error.
func retryUnavailable(ctx context.Context, fn func() error) (int, error) {
	for attempt := 1; ; attempt++ {
		err := fn()
		if !errors.Is(err, errUnavailable) || attempt == adminAttempts {
			return attempt - 1, err
		}
		select {
		case <-ctx.Done():
			return attempt - 1, errors.Join(err, ctx.Err())
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// catalogSKUs names a catalog's SKUs by rank, the hottest first.
func catalogSKUs(prefix string, n int) []string {
	width := len(strconv.Itoa(max(n-1, 0)))
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("%s%0*d", prefix, width, i)
	}
	return skus
}

// runCatalog runs the catalog scenario against the fleet of strategy on b;
// redisMasters is where a reserved strategy counts the stock (1 or the
// cluster's masters), 0 for the others. A strategy of
// CATALOG_KNEE_STRATEGIES runs it at each of CATALOG_KNEE_WORKERS in turn,
// each step on a catalog of its own, until orders/s stops rising
// (report.KneeRising); the others once, at CATALOG_WORKERS. It appends the
// run that stands for them to the report (report.KneeFigure).
func (d *demo) runCatalog(ctx context.Context, f *fleet, b backend, strategy string, redisMasters, round int) {
	steps := []int{d.p.CatalogWorkers}
	knee := slices.Contains(d.p.CatalogKneeStrategies, strategy) && len(d.p.CatalogKneeWorkers) > 1
	if knee {
		steps = d.p.CatalogKneeWorkers
	}
	var runs []*report.Catalog
	for i, workers := range steps {
		step := 0
		if knee {
			step = i + 1
			d.progress.note("catalog: step %d of at most %d, %d workers", step, len(steps), workers)
		}
		runs = append(runs, d.catalogStep(ctx, f, b, strategy, redisMasters, round, workers, step))
		if ctx.Err() != nil || !report.KneeRising(runs) {
			break
		}
	}
	if c := report.KneeFigure(runs); c != nil {
		d.rep.CatalogRuns = append(d.rep.CatalogRuns, c)
		if knee {
			d.progress.note("catalog: %.0f orders/s at %d workers, the most of %d steps; flat from %d workers", c.OrdersPerSec, c.Workers, len(runs), c.KneeAt())
		}
	}
}

// catalogStep runs the catalog once, at workers workers; step numbers a
// step of a knee (its SKUs and files apart from the other steps'), 0 for
// a single run.
func (d *demo) catalogStep(ctx context.Context, f *fleet, b backend, strategy string, redisMasters, round, workers, step int) *report.Catalog {
	c := &report.Catalog{
		Backend: b.Name, Strategy: strategy, RedisMasters: redisMasters, Round: round, Instances: len(f.instances),
		SKUs: d.p.CatalogSKUs, StockPerSKU: int64(d.p.CatalogStock), Workers: workers, Duration: d.p.CatalogDuration,
		ZipfS: d.p.CatalogZipfS, ZipfV: d.p.CatalogZipfV, AdminWorkers: d.p.CatalogAdminWorkers, SetupBatch: catalogRequestSKUs,
	}
	where := "db"
	if redisMasters > 1 {
		where = "rc"
	} else if redisMasters == 1 {
		where = "r1"
	}
	// cat-<run>-<backend>-<strategy>-<where>-<rank>: 44 characters
	// with the longest strategy names and 10,000 SKUs, under the
	// service's 64.
	c.Prefix = fmt.Sprintf("cat-%s-%s-%s-%s-", d.runID, b.Name[:2], strategy, where)
	name := b.Name + "-" + strategy
	if redisMasters > 1 {
		name += "-cluster"
	}
	c.Dir = filepath.ToSlash(filepath.Join("runs", name, fmt.Sprintf("round-%d", round), "catalog"))
	if step > 0 {
		// k<step>-: 47 characters at most, under the service's 64.
		c.Prefix += fmt.Sprintf("k%d-", step)
		c.Dir += fmt.Sprintf("/workers-%d", workers)
	}
	runDir := filepath.Join(d.dir, filepath.FromSlash(c.Dir))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		c.Error = err.Error()
		return c
	}
	began := time.Now()
	defer func() { c.Wall = time.Since(began) }()
	skus := catalogSKUs(c.Prefix, c.SKUs)
	urls := f.urls()
	admin := goClient(c.AdminWorkers, len(urls))
	defer admin.CloseIdleConnections()

	// Set-up: every SKU on sale.
	before := d.clusterKeys(ctx, redisMasters)
	setup := time.Now()
	var retries int64
	var err error
	for from := 0; from < len(skus) && err == nil; from += catalogRequestSKUs {
		chunk := skus[from:min(from+catalogRequestSKUs, len(skus))]
		// A retry goes to the next instance, with the same key: a start
		// that landed is answered, not run again.
		key := fmt.Sprintf("%s%d", c.Prefix, from)
		try := 0
		var n int
		n, err = retryUnavailable(ctx, func() error {
			try++
			return startCatalog(ctx, admin, urls[(from/catalogRequestSKUs+try-1)%len(urls)], d.p.AdminToken, key, chunk, c.StockPerSKU)
		})
		retries += int64(n)
	}
	c.Setup, c.SetupRetries = time.Since(setup), retries
	if err != nil {
		c.Error = fmt.Sprintf("putting %d SKUs on sale: %v", len(skus), err)
		d.progress.note("catalog: %s", c.Error)
		return c
	}
	if after := d.clusterKeys(ctx, redisMasters); len(after) == len(before) {
		for i := range after {
			c.MasterKeys = append(c.MasterKeys, after[i]-before[i])
		}
	}
	d.progress.note("catalog: %s SKUs of %d units on sale in %.2fs (%.0f SKUs/s, PUT /admin/stock of up to %d SKUs, %d retried after a 503)%s",
		fmtCount(len(skus)), c.StockPerSKU, c.Setup.Seconds(), float64(len(skus))/c.Setup.Seconds(), catalogRequestSKUs, c.SetupRetries, masterKeysSuffix(c.MasterKeys))

	// The load, and what it cost. On the cluster the meter's Redis is
	// not the cluster's: it measures one Redis only.
	var meter *cpuMeter
	var start cpuSample
	if redisMasters <= 1 {
		meter = d.meter(f, b, strategy).with(selfComponent())
		start = meter.sample(0, 0)
	}
	t := goCatalog(ctx, catalogLoad{urls: urls, skus: skus, workers: c.Workers, duration: c.Duration, s: c.ZipfS, v: c.ZipfV, seed: catalogSeed})
	c.Orders, c.SoldOut, c.Busy, c.Other = t.orders.Load(), t.soldOut.Load(), t.busy.Load(), t.other.Load()
	if meter != nil {
		note := "the load, from the first order to the last answer"
		if redisMasters == 1 {
			note += "; the orders still on their way to the database then are written after it"
		}
		c.Cost = meter.cost(start, meter.sample(t.answers.Load(), c.Orders), note)
	}
	c.Requests, c.Elapsed = t.answers.Load(), t.elapsed
	if c.Elapsed > 0 {
		c.OrdersPerSec = float64(c.Orders) / c.Elapsed.Seconds()
		c.RequestsPerSec = float64(c.Requests) / c.Elapsed.Seconds()
	}
	c.P50, c.P99 = t.lat.quantile(0.5), t.lat.quantile(0.99)
	var errs []error
	if err := f.dead(); err != nil {
		errs = append(errs, fmt.Errorf("an instance died during the run: %w", err))
	}

	// The audit of every SKU, once the reserved strategies' orders are
	// all in the database.
	var ordered []int
	for i := range skus {
		if t.requests[i].Load() > 0 {
			ordered = append(ordered, i)
		}
	}
	auditing := time.Now()
	audits, drain, err := d.auditCatalog(ctx, admin, urls, skus, ordered, redisMasters > 0)
	c.AuditTime, c.Drain = time.Since(auditing)-drain, drain
	if err != nil {
		errs = append(errs, err)
	}
	all := make([]report.SKUAudit, 0, len(skus))
	for i, a := range audits {
		if a == nil {
			continue
		}
		all = append(all, report.SKUAudit{SKU: skus[i], Rank: i, Requests: t.requests[i].Load(), Created: t.created[i].Load(), Audit: *a})
		if a.Orders > 0 {
			d.skus[b.Name] = append(d.skus[b.Name], skus[i])
		}
	}
	c.AddAudits(all)
	if file, err := writeCatalogFile(runDir, c.Dir, all); err != nil {
		errs = append(errs, err)
	} else {
		c.File = file
	}
	if err := errors.Join(errs...); err != nil {
		c.Error = err.Error()
	}
	v := c.Judge()
	worst := "none"
	if c.Worst != nil {
		worst = c.Worst.Describe()
	}
	d.progress.note("catalog: %s orders in %.1fs, %.0f orders/s (%.0f requests/s, p99 %s), %s sold out, %s busy, %s other; top 10 SKUs %.0f%% of the orders",
		fmtCount(int(c.Orders)), c.Elapsed.Seconds(), c.OrdersPerSec, c.RequestsPerSec, c.P99.Round(time.Millisecond),
		fmtCount(int(c.SoldOut)), fmtCount(int(c.Busy)), fmtCount(int(c.Other)), 100*c.Top10Share)
	d.progress.note("catalog audit in %.1fs%s: %s of %s SKUs exact, %s sold out, %s of %s units sold; worst SKU: %s → %s",
		c.AuditTime.Seconds(), drainSuffix(c.Drain), fmtCount(c.Exact), fmtCount(c.Audited), fmtCount(c.SKUsSoldOut),
		fmtCount(int(c.Ordered)), fmtCount(int(c.Initial)), worst, report.StatusText(v))
	return c
}

// auditCatalog reads every SKU's audit, a bounded number at a time. With
// drain set (redis-reserve, redis-watch), it first reads the SKUs the load
// sent orders for (ordered, by rank) until none of them has an order still
// on its way to the database, for at most catalogDrainTimeout, and returns
// how long after the load that took.
func (d *demo) auditCatalog(ctx context.Context, client *http.Client, urls, skus []string, ordered []int, drain bool) ([]*report.Audit, time.Duration, error) {
	audits := make([]*report.Audit, len(skus))
	read := func(idx []int) error {
		return forEach(ctx, len(idx), d.p.CatalogAdminWorkers, func(j int) error {
			i := idx[j]
			try := 0
			_, err := retryUnavailable(ctx, func() error {
				a, err := auditSKU(ctx, client, urls[(i+try)%len(urls)], d.p.AdminToken, skus[i])
				try++
				audits[i] = a
				return err
			})
			return err
		})
	}
	var drained time.Duration
	if drain {
		// Other processes' consumers write the orders: the audit is the
		// signal, so poll it.
		began := time.Now()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for waiting := ordered; ; {
			if err := read(waiting); err != nil {
				return audits, time.Since(began), fmt.Errorf("waiting for the orders to reach the database: %w", err)
			}
			var still []int
			for _, i := range waiting {
				if audits[i].Pending > 0 {
					still = append(still, i)
				}
			}
			if waiting = still; len(waiting) == 0 {
				drained = time.Since(began)
				break
			}
			if time.Since(began) > catalogDrainTimeout {
				return audits, time.Since(began), fmt.Errorf("%d SKUs still had orders pending %s after the load", len(waiting), catalogDrainTimeout)
			}
			select {
			case <-ctx.Done():
				return audits, time.Since(began), ctx.Err()
			case <-tick.C:
			}
		}
	}
	all := make([]int, len(skus))
	for i := range all {
		all[i] = i
	}
	// A SKU still pending now shows as not exact.
	if err := read(all); err != nil {
		return audits, drained, fmt.Errorf("auditing %d SKUs: %w", len(skus), err)
	}
	return audits, drained, nil
}

// auditSKU is GET /admin/audit/{sku}.
func auditSKU(ctx context.Context, client *http.Client, url, token, sku string) (*report.Audit, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/admin/audit/"+sku, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("audit of %s: %w", sku, err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
		return nil, fmt.Errorf("audit of %s from %s: %w %s", sku, url, errUnavailable, body)
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("audit of %s from %s: %s %s %v", sku, url, resp.Status, body, err)
	}
	var a report.Audit
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, fmt.Errorf("audit of %s from %s: %w", sku, url, err)
	}
	return &a, nil
}

// forEach calls fn for 0 … n−1 from at most workers goroutines, and stops
// handing out work at the first error, which it returns.
func forEach(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := fn(i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// writeCatalogFile writes catalog.tsv: one line per SKU that was ordered or
// is not exact (the others are all "initial = available, no order").
func writeCatalogFile(dir, rel string, skus []report.SKUAudit) (string, error) {
	f, err := os.Create(filepath.Join(dir, "catalog.tsv"))
	if err != nil {
		return "", err
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "# every SKU that was ordered or is not exact; every other SKU was audited exact with nothing ordered")
	fmt.Fprintln(w, "rank\tsku\trequests\tcreated_201\tinitial\tavailable\tordered\torder_rows\tpending\texact\tdrift")
	for _, s := range skus {
		if s.Requests == 0 && s.Audit.Orders == 0 && s.Exact() {
			continue
		}
		a := s.Audit
		fmt.Fprintf(w, "%d\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t%s\n", s.Rank+1, s.SKU, s.Requests, s.Created,
			a.Initial, a.Available, a.Ordered, a.Orders, a.Pending, s.Exact(), a.Drift)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return "", err
	}
	return rel + "/catalog.tsv", nil
}

// runClusterCatalog starts the instances of a reserved strategy on the
// demo's Redis Cluster (REDIS_MODE=cluster) and runs the catalog on them.
func (d *demo) runClusterCatalog(ctx context.Context, b backend, strategy string, round int) {
	masters := len(d.cluster)
	d.progress.begin("%s · %s on a Redis Cluster of %d masters: %d instances, catalog", b.Name, strategy, masters, d.p.Instances)
	logDir := filepath.Join(d.dir, "runs", b.Name+"-"+strategy+"-cluster", fmt.Sprintf("round-%d", round))
	fail := func(err error) {
		d.rep.CatalogRuns = append(d.rep.CatalogRuns, &report.Catalog{Backend: b.Name, Strategy: strategy, RedisMasters: masters, Round: round,
			SKUs: d.p.CatalogSKUs, StockPerSKU: int64(d.p.CatalogStock), Error: err.Error()})
		d.progress.note("%v", err)
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		fail(err)
		return
	}
	env := d.serviceEnv(b, strategy)
	for i, kv := range env {
		if strings.HasPrefix(kv, "REDIS_ADDRS=") {
			env[i] = "REDIS_ADDRS=" + strings.Join(d.cluster, ",")
		}
	}
	env = append(env, "REDIS_MODE=cluster")
	f, err := startFleet(ctx, d.p.StockBin, d.p.Instances, env, logDir)
	if err != nil {
		fail(fmt.Errorf("instances did not start: %w", err))
		return
	}
	defer func() {
		if err := f.stop(); err != nil {
			d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("%s-%s on the Redis Cluster: stopping the instances: %v", b.Name, strategy, err))
		}
	}()
	d.runCatalog(ctx, f, b, strategy, masters, round)
}

// clusterKeys returns every cluster master's DBSIZE, nil when the run is
// not on the cluster or a master does not answer.
func (d *demo) clusterKeys(ctx context.Context, redisMasters int) []int64 {
	if redisMasters <= 1 || d.cluster == nil {
		return nil
	}
	var keys []int64
	for _, addr := range d.cluster {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		n, err := c.DBSize(ctx).Result()
		_ = c.Close()
		if err != nil {
			return nil
		}
		keys = append(keys, n)
	}
	return keys
}

func masterKeysSuffix(keys []int64) string {
	if len(keys) == 0 {
		return ""
	}
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmtCount(int(k)))
	}
	return "; keys per master " + strings.Join(parts, " · ")
}

func drainSuffix(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf(" after waiting %.1fs for the orders to reach the database", d.Seconds())
}

// fmtCount writes 12345 as 12,345.
func fmtCount(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// catalogSKUsLeft counts the catalogs' SKUs that were never ordered: the
// clean-up leaves their stock rows as they are.
func catalogSKUsLeft(cats []*report.Catalog) int {
	n := 0
	for _, c := range cats {
		if len(c.Knee) == 0 {
			n += c.Audited - c.SKUsOrdered
		}
		for _, s := range c.Knee {
			n += s.Audited - s.SKUsOrdered
		}
	}
	return n
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmtCount(n) + " " + many
}
