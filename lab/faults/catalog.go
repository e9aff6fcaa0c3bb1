package faults

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// A catalog run puts many SKUs on sale (10,000 in the full form, 1,000 in
// the short one) and orders them as a shop's buyers do: a handful of hot
// SKUs take most of the orders, most SKUs are ordered seldom or never. Its
// checks are every run's, for every SKU of the catalog; the result sums
// them (CatalogFigures) and names the worst SKU.

// catalogSkew is the exponent of the catalog runs' Zipf-like load: over
// 10,000 SKUs the 5 hottest take about half the orders, the 100 hottest
// about four fifths, and a few hundred cold SKUs get an order or two in a
// run.
const catalogSkew = 1.3

// adminWorkers bounds the admin calls a run makes at once (a catalog's
// PUT /admin/stock and GET /admin/audit, thousands of each).
const adminWorkers = 16

// minCatalogStock is the stock of the coldest SKUs: a few orders sell them
// out, so cold SKUs answer 409s too.
const minCatalogStock = 5

// catalogSize is the SKUs of a catalog run: Env.CatalogSKUs, else 10,000
// (short form: 1,000).
func (e *Env) catalogSize() int {
	switch {
	case e.CatalogSKUs > 0:
		return e.CatalogSKUs
	case e.Short:
		return 1000
	}
	return 10000
}

// catalog is a run's SKUs on sale, in order of popularity: the load
// (loadSpec.skew) orders skus[0] the most.
type catalog struct {
	skus    []string
	weights []float64 // each SKU's share of the orders
}

// newCatalog names n SKUs prefix-00000 and so on and ranks them in a random
// order, so that the hot SKUs are spread over the names (and over whatever
// walks them in order).
func newCatalog(prefix string, n int) *catalog {
	c := &catalog{skus: make([]string, n), weights: zipfWeights(n, catalogSkew)}
	for i, k := range rand.Perm(n) {
		c.skus[i] = fmt.Sprintf("%s-%05d", prefix, k)
	}
	return c
}

// hot returns the n most ordered SKUs.
func (c *catalog) hot(n int) []string { return c.skus[:min(n, len(c.skus))] }

// stock sizes each SKU's stock for a load of rate orders per second over d:
// frac of the units its share of the load asks for (two per order on
// average), at least minCatalogStock. With frac below 1 the hot SKUs sell
// out late in the load, after the fault.
func (c *catalog) stock(skus []string, rate float64, d time.Duration, frac float64) map[string]int64 {
	rank := make(map[string]int, len(c.skus))
	for i, sku := range c.skus {
		rank[sku] = i
	}
	stock := make(map[string]int64, len(skus))
	for _, sku := range skus {
		units := rate * d.Seconds() * 2 * c.weights[rank[sku]] * frac
		stock[sku] = max(minCatalogStock, int64(math.Round(units)))
	}
	return stock
}

// startCatalog starts the sale of every SKU of stock, adminWorkers at a
// time, spread over the running instances. A sale that fails is started
// again, up to three times in all: this is the set-up, before any order, so
// starting a sale twice changes nothing (the retries are counted). It
// records the stock in the run and returns how long it took and how many
// retries it made.
func (r *run) startCatalog(ctx context.Context, stock map[string]int64) (time.Duration, int, error) {
	began := time.Now()
	var retries atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(adminWorkers)
	for i, sku := range slices.Sorted(maps.Keys(stock)) {
		g.Go(func() error {
			var err error
			for try := range 3 {
				if try > 0 {
					retries.Add(1)
					pause(gctx, 100*time.Millisecond)
				}
				if err = r.cluster.StartSaleVia(gctx, i%len(r.cluster.Instances), sku, stock[sku]); err == nil {
					return nil
				}
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return 0, int(retries.Load()), fmt.Errorf("start the catalog's sales: %w", err)
	}
	for sku, n := range stock {
		r.initial[sku] = n
	}
	return time.Since(began), int(retries.Load()), nil
}

// loadOnCatalog puts the catalog cat on sale, each SKU's stock sized for
// spec's rate over d (frac of what its share asks for), records the set-up
// in the result, and starts spec's load, which orders cat's SKUs by their
// popularity (the scenario stops it: loadUntil).
func (r *run) loadOnCatalog(ctx context.Context, cat *catalog, spec loadSpec, d time.Duration, frac float64) error {
	stock := cat.stock(cat.skus, spec.rate, d, frac)
	took, retries, err := r.startCatalog(ctx, stock)
	if err != nil {
		return err
	}
	r.cat = cat
	r.res.Catalog = &CatalogFigures{SKUs: len(cat.skus), Skew: catalogSkew, SetupSeconds: seconds(took),
		SetupWorkers: adminWorkers, SetupPerSecond: float64(len(cat.skus)) / took.Seconds(), SetupRetries: retries,
		MinStock: slices.Min(slices.Collect(maps.Values(stock))), MaxStock: slices.Max(slices.Collect(maps.Values(stock)))}
	r.env.logf("  %d SKUs put on sale in %.1fs (%d at a time)", len(cat.skus), took.Seconds(), adminWorkers)
	spec.skew = catalogSkew
	r.startLoad(ctx, cat.skus, spec)
	return nil
}

// loadUntil lets the load run until its clock reaches end, and at least
// after past faultEnd (a slow restart must not leave the run without load
// after its fault), then stops it, and returns when it stopped.
func (r *run) loadUntil(ctx context.Context, end, faultEnd, after time.Duration) time.Duration {
	pause(ctx, max(end, faultEnd+after)-r.load.now())
	r.load.stop()
	stopped := r.load.now()
	r.res.Config.LoadSeconds = stopped.Seconds()
	return stopped
}

// auditAll audits skus, adminWorkers at a time through the instances in
// turn. With drain, a SKU with accepted orders still on their way to the
// database (Pending, redis-reserve and redis-watch) is audited again until
// it has none, for at most 30 seconds in all, so that its rows can be
// checked against every answer: the instances' consumers drain the
// streams, and the audit is the only signal, so it is polled.
func (r *run) auditAll(ctx context.Context, skus []string, drain bool) (map[string]Audit, error) {
	deadline := time.Now().Add(30 * time.Second)
	var mu sync.Mutex
	audits := make(map[string]Audit, len(skus))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(adminWorkers)
	for i, sku := range skus {
		g.Go(func() error {
			for {
				a, err := r.cluster.AuditVia(gctx, i%len(r.cluster.Instances), sku)
				if err == nil && (!drain || a.Pending == 0) {
					mu.Lock()
					audits[sku] = a
					mu.Unlock()
					return nil
				}
				if time.Now().After(deadline) {
					if err != nil {
						return fmt.Errorf("audit %s: %w", sku, err)
					}
					return fmt.Errorf("%s: orders still on their way to the database after 30s (audit %+v)", sku, a)
				}
				pause(gctx, 50*time.Millisecond)
				if gctx.Err() != nil {
					return gctx.Err()
				}
			}
		})
	}
	return audits, g.Wait()
}

// skuFigures returns the figures of one sale of the run (a SKU, or the
// second sale of one started again), creating them.
func (r *run) skuFigures(sale string) *SKUFigures {
	if r.perSKU == nil {
		r.perSKU = map[string]*SKUFigures{}
	}
	f := r.perSKU[sale]
	if f == nil {
		f = &SKUFigures{SKU: sale}
		r.perSKU[sale] = f
	}
	return f
}

// summarizeCatalog fills in the catalog's figures once every check has
// run: how many SKUs came out exact, the worst and the hottest, and keeps
// in the result only the audits worth reading (every SKU that is not
// exact, up to 50, then the 10 hottest).
func (r *run) summarizeCatalog(orders []*order) {
	c := r.res.Catalog
	ordered := map[string]bool{}
	for _, o := range orders {
		ordered[o.sku] = true
	}
	c.SKUsOrdered = len(ordered)
	var all []*SKUFigures
	for _, f := range r.perSKU {
		f.Exact = f.exact()
		all = append(all, f)
		c.Audited++
		if f.Exact {
			c.Exact++
		}
		if f.Created > 0 {
			c.SKUsSold++
		}
	}
	if len(all) == 0 {
		return
	}
	worst := slices.MaxFunc(all, func(a, b *SKUFigures) int {
		return cmp.Or(cmp.Compare(a.badness(), b.badness()), cmp.Compare(a.Created, b.Created), cmp.Compare(b.SKU, a.SKU))
	})
	w := *worst
	c.Worst = &w
	if hot := r.perSKU[r.cat.skus[0]]; hot != nil {
		h := *hot
		c.Hottest = &h
	}
	hot := map[string]bool{}
	for _, sku := range r.cat.hot(10) {
		hot[sku], hot[secondSale(sku)] = true, true
	}
	var hot10 int
	for _, o := range orders {
		if hot[o.sku] {
			hot10++
		}
	}
	if len(orders) > 0 {
		c.Hot10Share = float64(hot10) / float64(len(orders))
	}

	keep := map[string]bool{}
	for _, f := range all {
		if !f.Exact && len(keep) < 50 {
			keep[f.SKU] = true
		}
	}
	maps.Copy(keep, hot)
	audits := r.res.Audits[:0]
	for _, a := range r.res.Audits {
		if keep[a.SKU] {
			audits = append(audits, a)
		}
	}
	r.res.Audits = audits
}

// exact: every check of the SKU held: the audit adds up, nothing oversold,
// its rows hold what the audit says was ordered, every 201 has its row (but
// for those lost with Redis's data, which the documentation allows and the
// result counts), and no row was made by a request told otherwise or made
// twice.
func (f *SKUFigures) exact() bool {
	return f.Consistent && f.Oversold == 0 && f.RowUnits == f.Ordered && f.Lost == 0 && f.Phantom == 0 && f.Duplicate == 0
}

// badness orders the SKUs from the furthest from exact: an oversell first,
// then lost, invented or doubled orders, then books that do not add up,
// then orders lost with Redis's data.
func (f *SKUFigures) badness() int64 {
	abs := func(x int64) int64 { return max(x, -x) }
	b := 1_000_000*f.Oversold + 10_000*int64(f.Lost+f.Phantom+f.Duplicate) +
		100*(abs(f.Initial-f.Available-f.Ordered)+abs(f.RowUnits-f.Ordered)) + int64(f.LostWithRedis)
	if !f.Consistent {
		b += 100
	}
	return b
}

// secondSale names the second sale of a SKU whose sale a run started
// again: its orders, rows and history are checked apart from the first's.
func secondSale(sku string) string { return sku + "#2" }

// afterFault measures the load from at (the end of a fault) to end, of the
// SKUs in only when it is not nil: the first 201, the rate of 201s (and
// the rate before the fault began, at fault) and the 503s; and for each
// SKU ordered from then on, the first of its orders called
// then: was it answered 201 or 409, and how long did that take. The
// slowest of those answers says how long a SKU that is ordered waits to
// sell again, whatever the size of the catalog; a first order answered
// 503 is a SKU that did not sell again at once.
func afterFault(orders []*order, fault, at, end time.Duration, what string, only map[string]bool) *AfterFault {
	if only != nil {
		orders = filterOrders(orders, only)
	}
	a := &AfterFault{What: what, FromS: seconds(at), FirstCreatedS: recovery(orders, at, -1)}
	f := figures(orders, at, end)
	a.Requests, a.Created, a.SoldOut, a.Responses503 = f.Requests, f.Created, f.SoldOut, f.Responses503
	if span := (end - at).Seconds(); span > 0 {
		a.CreatedPerSecond = float64(f.Created) / span
	}
	if before := figures(orders, 0, fault); fault > 0 {
		a.CreatedPerSecondBefore = float64(before.Created) / fault.Seconds()
	}
	first := map[string]attempt{} // the first attempt called at or after at, by SKU
	for _, o := range orders {
		for _, t := range o.attempts {
			if c, ok := first[o.sku]; t.call >= at && (!ok || t.call < c.call) {
				first[o.sku] = t
			}
		}
	}
	a.SKUsOrdered = len(first)
	var waits []float64
	for sku, t := range first {
		if t.answer != ansCreated && t.answer != ansSoldOut {
			a.SKUsFirstRefused++
			if a.RefusedSKU == "" || sku < a.RefusedSKU {
				a.RefusedSKU, a.RefusedAnswer = sku, answerName[t.answer]
			}
			continue
		}
		w := seconds(t.ret - t.call)
		waits = append(waits, w)
		if w > 1 {
			a.SKUsOverASecond++
		}
		if w > a.SlowestFirstAnswerS || a.SlowestSKU == "" {
			a.SlowestSKU, a.SlowestFirstAnswerS = sku, w
		}
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		a.MedianFirstAnswerS = waits[len(waits)/2]
	}
	return a
}

// saleStride is the step between two sales' numbers in the stock rows
// (internal/reservation's saleStride): a check of a restarted Redis adds
// one to the sale's number, a new sale moves to the next multiple.
const saleStride = 1 << 20

// countChecks counts, in a reserved strategy's catalog, the sales checked
// against the database since they started (after a Redis restart) and how
// often: each check raises the sale's number by one.
func (r *run) countChecks(ctx context.Context) {
	stock, err := readStock(ctx, r.dbURL)
	if err != nil {
		r.note("cannot count the checks of the sales: %v", err)
		return
	}
	c := r.res.Catalog
	for _, row := range stock {
		n := int(row.saleEpoch % saleStride)
		if n > 0 {
			c.SalesChecked++
		}
		if n > 1 {
			c.SalesCheckedAgain++
		}
		c.MostChecks = max(c.MostChecks, n)
	}
	r.note("%d sales were checked against the database after the restart, %d of them more than once (at most %d times)",
		c.SalesChecked, c.SalesCheckedAgain, c.MostChecks)
}
