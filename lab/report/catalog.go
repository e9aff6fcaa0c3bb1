package report

import (
	"cmp"
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Catalog is the catalog scenario of one strategy on one backend: a sale of
// StockPerSKU units on each of SKUs SKUs (PUT /admin/stock/{sku}), then
// Workers keep-alive workers of the Go client ordering one unit at a time
// for Duration, each order's SKU drawn from a Zipf distribution over the
// SKUs' ranks, P(rank k) ∝ (ZipfV + k)^−ZipfS for k = 0 … SKUs−1, so that a
// handful of hot SKUs take most of the orders and sell out while the rest
// sell a few units; then an audit of every SKU (GET /admin/audit/{sku}).
type Catalog struct {
	Backend  string `json:"backend"`
	Strategy string `json:"strategy"`
	// RedisMasters is where redis-reserve and redis-watch count the
	// stock: 1 for one Redis, 3 for a Redis Cluster of three masters; 0
	// for the strategies without a Redis of their own.
	RedisMasters int `json:"redis_masters,omitempty"`
	Round        int `json:"round,omitempty"`
	Instances    int `json:"instances"`
	// Prefix is the SKUs' common prefix: a SKU is Prefix + its rank,
	// 00000 the hottest.
	Prefix       string        `json:"prefix"`
	SKUs         int           `json:"skus"`
	StockPerSKU  int64         `json:"stock_per_sku"`
	Workers      int           `json:"workers"`
	Duration     time.Duration `json:"duration_ns"`
	ZipfS        float64       `json:"zipf_s"`
	ZipfV        float64       `json:"zipf_v"`
	AdminWorkers int           `json:"admin_workers"`
	// SetupBatch is the SKUs of one PUT /admin/stock that put the
	// catalog on sale; 0 for a run that sent PUT /admin/stock/{sku} for
	// each, AdminWorkers at a time (before the collection's route).
	SetupBatch int `json:"setup_batch,omitempty"`
	// Setup is how long putting every SKU on sale took; MasterKeys the
	// keys each Redis Cluster master gained meanwhile (DBSIZE before and
	// after), which shows the spread.
	Setup      time.Duration `json:"setup_ns"`
	MasterKeys []int64       `json:"master_keys,omitempty"`
	// SetupRetries counts the PUTs sent again after a 503 (nothing done).
	SetupRetries int64 `json:"setup_retries,omitempty"`

	// The load, as the Go client saw it: every answer to POST /orders.
	// Busy is 503; Other any other answer, transport errors included.
	Requests int64 `json:"requests"`
	Orders   int64 `json:"orders"`
	SoldOut  int64 `json:"sold_out"`
	Busy     int64 `json:"busy"`
	Other    int64 `json:"other"`
	// Elapsed runs from the first order to the last answer; the rates
	// divide by it.
	Elapsed        time.Duration `json:"elapsed_ns"`
	OrdersPerSec   float64       `json:"orders_per_sec"`
	RequestsPerSec float64       `json:"requests_per_sec"`
	P50            time.Duration `json:"p50_ns"`
	P99            time.Duration `json:"p99_ns"`
	// Top10Share is the share of the requests that went to the ten
	// hottest ranks, as measured.
	Top10Share float64 `json:"top10_share"`

	// The audit of every SKU. Drain is how long after the load the last
	// accepted order reached the database (redis-reserve, redis-watch:
	// the ordered SKUs' audits polled until none has an order pending),
	// AuditTime how long reading every SKU's audit took after that.
	AuditTime time.Duration `json:"audit_ns"`
	Drain     time.Duration `json:"drain_ns,omitempty"`
	Audited   int           `json:"audited"`
	Exact     int           `json:"exact"`
	// SKUsRequested got at least one order sent, SKUsOrdered have an
	// order row, SKUsSoldOut have nothing left.
	SKUsRequested int `json:"skus_requested"`
	SKUsOrdered   int `json:"skus_ordered"`
	SKUsSoldOut   int `json:"skus_sold_out"`
	// Initial, Available and Ordered add up every SKU's audit.
	Initial   int64 `json:"initial"`
	Available int64 `json:"available"`
	Ordered   int64 `json:"ordered"`
	// Worst is the SKU furthest from exact, nil when every SKU is exact;
	// Hottest is rank 0; NotExact the SKUs that are not exact, worst
	// first, at most MaxNotExact of them.
	Worst    *SKUAudit  `json:"worst,omitempty"`
	Hottest  *SKUAudit  `json:"hottest,omitempty"`
	NotExact []SKUAudit `json:"not_exact,omitempty"`
	// File lists every SKU that was ordered or is not exact, relative
	// to the report's directory.
	File string `json:"file,omitempty"`
	Dir  string `json:"dir,omitempty"`
	// Wall is the whole scenario, set-up to audit: what it adds to the
	// demo.
	Wall  time.Duration `json:"wall_ns"`
	Error string        `json:"error,omitempty"`
	// Cost is the CPU the load took, by process class (Answered every
	// answer, Sold the 201s); nil on a Redis Cluster.
	Cost *CPUCost `json:"cost,omitempty"`
	// Knee is every step of a load raised step by step (CATALOG_KNEE),
	// in the order run, this run among them; empty for a single run.
	Knee []KneeStep `json:"knee,omitempty"`
}

// MaxNotExact bounds the SKUs a Catalog lists by name; File has them all.
const MaxNotExact = 20

// SKUAudit is one SKU of a catalog: what the Go client sent and was told,
// and the service's audit after the load.
type SKUAudit struct {
	SKU  string `json:"sku"`
	Rank int    `json:"rank"`
	// Requests is the orders sent for it, Created the 201s among them.
	Requests int64 `json:"requests"`
	Created  int64 `json:"created"`
	Audit    Audit `json:"audit"`
}

// Oversold is the units sold beyond the SKU's stock.
func (s SKUAudit) Oversold() int64 {
	return max(s.Audit.Ordered-s.Audit.Initial, -s.Audit.Available, 0)
}

// Unrecorded is units that left the stock without an order row.
func (s SKUAudit) Unrecorded() int64 {
	return max(s.Audit.Initial-s.Audit.Available-s.Audit.Ordered, 0)
}

// Unconfirmed is 201 answers without an order row: lost orders.
func (s SKUAudit) Unconfirmed() int64 { return max(s.Created-s.Audit.Orders, 0) }

// Exact: nothing oversold, every unit that left the stock is an order
// row, every 201 has its row, nothing still pending, and the database
// agrees with where the stock is counted (no drift).
func (s SKUAudit) Exact() bool {
	a := s.Audit
	return a.Available >= 0 && a.Initial == a.Available+a.Ordered && s.Unconfirmed() == 0 && a.Pending == 0 && a.Drift == ""
}

// badness orders the SKUs from furthest from exact: units oversold, lost
// or unaccounted for, then one for a drift or a pending order.
func (s SKUAudit) badness() int64 {
	a := s.Audit
	off := a.Initial - a.Available - a.Ordered
	if off < 0 {
		off = -off
	}
	n := s.Oversold() + s.Unconfirmed() + off
	if n == 0 && !s.Exact() {
		n = 1
	}
	return n
}

// Describe writes the SKU's figures in one line.
func (s SKUAudit) Describe() string { return s.describe(s.SKU) }

// describe writes the SKU's figures with its name written as name.
func (s SKUAudit) describe(name string) string {
	a := s.Audit
	parts := []string{fmt.Sprintf("%s (rank %d): %s of %s sold in %s, %s left; %s sent, %s × 201",
		name, s.Rank+1, fmtInt(a.Ordered), fmtInt(a.Initial), plural(a.Orders, "order", "orders"), fmtInt(a.Available),
		plural(s.Requests, "order", "orders"), fmtInt(s.Created))}
	if n := s.Oversold(); n > 0 {
		parts = append(parts, fmt.Sprintf("%s oversold", plural(n, "unit", "units")))
	}
	if n := s.Unrecorded(); n > 0 {
		parts = append(parts, fmt.Sprintf("%s left the stock without an order", plural(n, "unit", "units")))
	}
	if n := s.Unconfirmed(); n > 0 {
		parts = append(parts, fmt.Sprintf("%s got 201 without an order row", plural(n, "buyer", "buyers")))
	}
	if a.Pending > 0 {
		parts = append(parts, fmt.Sprintf("%s still pending", plural(a.Pending, "order", "orders")))
	}
	if a.Drift != "" {
		parts = append(parts, "drift: "+a.Drift)
	}
	return strings.Join(parts, "; ")
}

// AddAudits sets c's audit figures from every SKU's: the totals, how many
// are exact, the worst and the hottest SKU, and the ones that are not
// exact.
func (c *Catalog) AddAudits(skus []SKUAudit) {
	c.Audited, c.Exact, c.SKUsRequested, c.SKUsOrdered, c.SKUsSoldOut = len(skus), 0, 0, 0, 0
	c.Initial, c.Available, c.Ordered = 0, 0, 0
	c.Worst, c.Hottest, c.NotExact = nil, nil, nil
	var top10, requests int64
	for i := range skus {
		s := skus[i]
		c.Initial += s.Audit.Initial
		c.Available += s.Audit.Available
		c.Ordered += s.Audit.Ordered
		requests += s.Requests
		if s.Rank < 10 {
			top10 += s.Requests
		}
		if s.Requests > 0 {
			c.SKUsRequested++
		}
		if s.Audit.Orders > 0 {
			c.SKUsOrdered++
		}
		if s.Audit.Initial > 0 && s.Audit.Available <= 0 {
			c.SKUsSoldOut++
		}
		if s.Rank == 0 {
			c.Hottest = &skus[i]
		}
		if s.Exact() {
			c.Exact++
			continue
		}
		c.NotExact = append(c.NotExact, s)
	}
	if requests > 0 {
		c.Top10Share = float64(top10) / float64(requests)
	}
	slices.SortStableFunc(c.NotExact, func(a, b SKUAudit) int {
		return cmp.Or(cmp.Compare(b.badness(), a.badness()), cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.Rank, b.Rank))
	})
	if len(c.NotExact) > 0 {
		w := c.NotExact[0]
		c.Worst = &w
	}
	if len(c.NotExact) > MaxNotExact {
		c.NotExact = c.NotExact[:MaxNotExact]
	}
}

// Label names the row: the strategy, and where a reserved strategy counts
// the stock.
func (c *Catalog) Label() string {
	switch {
	case c.RedisMasters == 1:
		return c.Strategy + " · one Redis"
	case c.RedisMasters > 1:
		return fmt.Sprintf("%s · Redis Cluster, %d masters", c.Strategy, c.RedisMasters)
	}
	return c.Strategy
}

// Judge returns the catalog's verdict: a safe strategy passes when every
// SKU was audited and is exact; the control's oversell of any SKU is what
// it is there to show. Oversold is the worst SKU's.
func (c *Catalog) Judge() Verdict {
	v := c.judgeRun()
	violations, broken := c.kneeProblems()
	if len(violations)+len(broken) == 0 {
		return v
	}
	v.Problems = append(append(v.Problems, violations...), broken...)
	switch {
	case len(violations) > 0 && (v.Status == StatusOK || v.Status == StatusError):
		v.Status = StatusFail
	case v.Status == StatusOK:
		v.Status = StatusError
	}
	return v
}

// judgeRun is Judge of this run alone, without the other steps of its
// knee.
func (c *Catalog) judgeRun() Verdict {
	v := Verdict{Conserved: c.Audited > 0 && c.Initial == c.Available+c.Ordered}
	if c.Worst != nil {
		v.Oversold = c.Worst.Oversold()
		v.Unrecorded = c.Worst.Unrecorded()
		v.Unconfirmed = c.Worst.Unconfirmed()
	}
	var broken []string
	switch {
	case c.Error != "":
		broken = append(broken, "run failed: "+c.Error)
	case c.Audited == 0:
		broken = append(broken, "no SKU was audited")
	case c.Audited < c.SKUs:
		broken = append(broken, fmt.Sprintf("only %s of %s SKUs audited", fmtInt(int64(c.Audited)), fmtInt(int64(c.SKUs))))
	}
	if c.Orders == 0 && len(broken) == 0 {
		broken = append(broken, "no order was accepted")
	}
	var violations []string
	if c.Worst != nil {
		violations = append(violations, fmt.Sprintf("%s of %s SKUs not exact; the worst, %s",
			fmtInt(int64(c.Audited-c.Exact)), fmtInt(int64(c.Audited)), c.Worst.Describe()))
	}
	v.Problems = append(violations, broken...)
	if IsControl(c.Strategy) {
		switch {
		case v.Oversold > 0:
			v.Status = StatusControlOversold
		case len(broken) > 0:
			v.Status = StatusError
		default:
			v.Status = StatusControlHeld
		}
		return v
	}
	switch {
	case len(violations) > 0:
		v.Status = StatusFail
	case len(broken) > 0:
		v.Status = StatusError
	default:
		v.Status = StatusOK
	}
	return v
}

// Catalogs returns the catalog runs in table order: backends, strategies,
// then one Redis before the cluster.
func (r *Report) Catalogs() []*Catalog {
	out := slices.Clone(r.CatalogRuns)
	slices.SortStableFunc(out, func(a, b *Catalog) int {
		return cmp.Or(
			cmp.Compare(indexOr(r.Backends, a.Backend), indexOr(r.Backends, b.Backend)),
			cmp.Compare(indexOr(r.Strategies, a.Strategy), indexOr(r.Strategies, b.Strategy)),
			cmp.Compare(a.RedisMasters, b.RedisMasters),
			cmp.Compare(a.Round, b.Round),
		)
	})
	return out
}

// catalogRow is one row of the catalog table. Worst names the SKU by its
// rank and the end of its name (its whole name is WorstSKU, the cell's
// tooltip); WorstFull is the same with the whole name, for report.md.
type catalogRow struct {
	Backend, Strategy, Redis                                    string
	SKUs, Stock, Setup, SetupRate                               string
	OrdersPerSec, BurstPerSec, VsBurst, RequestsPerSec          string
	Orders, SoldOut, Busy, Other, P99                           string
	Sold, SoldShare, SoldOutSKUs, Exact, Top10, Worst, WorstSKU string
	WorstFull                                                   string
	Status, StatusClass, Problems, AuditTime, MasterKeys        string
	// Drain is how long after the load the orders were all in the
	// database, "" for the strategies that answer after the database.
	Drain string
	// Knee is the steps of a load raised step by step, workers → orders/s
	// (KneeHTML marks the row's step in bold, KneeMD too), and KneeAt
	// where the curve flattened; "" for a single run.
	KneeHTML       template.HTML
	KneeMD, KneeAt string
	// DBPerSold is the database's CPU per 201 over the load, DBVsBurst
	// that against the same strategy's burst on one hot SKU (its selling
	// window); "" when not measured.
	DBPerSold, DBVsBurst          string
	Control, Bad, WorstRed, First bool
}

// dbPerSold is the database's CPU per 201 in c, in microseconds.
func dbPerSold(c *CPUCost) (float64, bool) {
	db, ok := c.component(ComponentDatabase)
	if !ok || !db.Measured() {
		return 0, false
	}
	return perOrder(db.CPU, c.Sold)
}

// shortSKU writes a catalog's SKU without the run's prefix.
func shortSKU(c *Catalog, s *SKUAudit) string {
	if c.Prefix != "" && strings.HasPrefix(s.SKU, c.Prefix) {
		return "…" + strings.TrimPrefix(s.SKU, c.Prefix)
	}
	return s.SKU
}

// catalogRows lines up every catalog run with the one-hot-SKU burst of the
// same strategy on the same backend (the median round's k6 orders/s).
func catalogRows(r *Report, burst []Row) []catalogRow {
	burstOf := map[string]Row{}
	for _, row := range burst {
		burstOf[row.Run.Backend+" "+row.Run.Strategy] = row
	}
	var out []catalogRow
	cats := r.Catalogs()
	for i, c := range cats {
		v := c.Judge()
		row := catalogRow{
			Backend: r.BackendLabel(c.Backend), Strategy: c.Strategy,
			SKUs: fmtInt(int64(c.SKUs)), Stock: fmtInt(c.StockPerSKU),
			Setup: fmtSeconds(c.Setup), SetupRate: "–",
			OrdersPerSec: fmtRate(c.OrdersPerSec), BurstPerSec: "–", VsBurst: "–",
			RequestsPerSec: fmtRate(c.RequestsPerSec),
			Orders:         fmtInt(c.Orders), SoldOut: fmtInt(c.SoldOut), Busy: fmtInt(c.Busy), Other: fmtInt(c.Other),
			P99:         fmtDur(c.P99),
			Sold:        fmtInt(c.Ordered) + " / " + fmtInt(c.Initial),
			SoldShare:   "–",
			SoldOutSKUs: plural(int64(c.SKUsSoldOut), "SKU", "SKUs"),
			Exact:       fmtInt(int64(c.Exact)) + " / " + fmtInt(int64(c.Audited)),
			Top10:       "–",
			AuditTime:   fmtSeconds(c.AuditTime),
			Status:      StatusText(v), StatusClass: string(v.Status),
			Problems: strings.Join(v.Problems, "; "),
			Control:  IsControl(c.Strategy),
			Bad:      v.Status == StatusFail || v.Status == StatusError,
			First:    i == 0 || cats[i-1].Backend != c.Backend,
		}
		switch {
		case c.RedisMasters == 1:
			row.Redis = "one Redis"
		case c.RedisMasters > 1:
			row.Redis = fmt.Sprintf("Redis Cluster, %d masters", c.RedisMasters)
		}
		if len(c.MasterKeys) > 0 {
			var keys []string
			for _, k := range c.MasterKeys {
				keys = append(keys, fmtInt(k))
			}
			row.MasterKeys = "keys per master " + strings.Join(keys, " · ")
		}
		if c.Drain > 0 {
			row.Drain = fmtSeconds(c.Drain)
		}
		if len(c.Knee) > 0 {
			// fmtRate writes digits and separators only: nothing to escape.
			row.KneeHTML = template.HTML(c.kneeText(func(s string) string { return `<b class="nw">` + s + "</b>" },
				func(s string) string { return `<span class="nw">` + s + "</span>" }))
			row.KneeMD = c.kneeText(func(s string) string { return "**" + s + "**" }, nil)
			row.KneeAt = fmt.Sprintf("%d workers", c.KneeAt())
		}
		if c.Setup > 0 && c.Audited > 0 {
			row.SetupRate = fmtRate(float64(c.SKUs) / c.Setup.Seconds())
		}
		if c.Initial > 0 {
			row.SoldShare = fmtPercent(float64(c.Ordered) / float64(c.Initial))
		}
		if c.Requests > 0 {
			row.Top10 = fmtPercent(c.Top10Share)
		}
		if b, ok := burstOf[c.Backend+" "+c.Strategy]; ok && b.Stats.OrdersPerSec > 0 {
			row.BurstPerSec = fmtRate(b.Stats.OrdersPerSec)
			if c.OrdersPerSec > 0 {
				row.VsBurst = fmtRatio(c.OrdersPerSec / b.Stats.OrdersPerSec)
			}
		}
		if cat, ok := dbPerSold(c.Cost); ok {
			row.DBPerSold = fmt.Sprintf("%.0f µs", cat)
			if b, ok := burstOf[c.Backend+" "+c.Strategy]; ok && b.Run != nil {
				if hot, ok := dbPerSold(b.Run.SellCost); ok && hot > 0 {
					row.DBVsBurst = fmtRatio(cat / hot)
				}
			}
		}
		switch {
		case c.Worst != nil:
			row.Worst, row.WorstSKU, row.WorstRed = c.Worst.describe(shortSKU(c, c.Worst)), c.Worst.SKU, true
			row.WorstFull = c.Worst.Describe()
		case c.Hottest != nil && c.Audited > 0:
			row.Worst, row.WorstSKU = "none: every SKU exact; the hottest, "+c.Hottest.describe(shortSKU(c, c.Hottest)), c.Hottest.SKU
			row.WorstFull = "none: every SKU exact; the hottest, " + c.Hottest.Describe()
		default:
			row.Worst, row.WorstFull = "–", "–"
		}
		// A run that failed says why where the worst SKU would be (for a
		// safe strategy the problems name the worst SKU too).
		if row.Bad {
			row.Worst, row.WorstFull, row.WorstRed = row.Problems, row.Problems, true
		}
		out = append(out, row)
	}
	return out
}

// catalogLoad describes the catalog's load in one sentence.
func catalogLoad(r *Report) string {
	cats := r.Catalogs()
	if len(cats) == 0 {
		return ""
	}
	c := cats[0]
	setup := fmt.Sprintf("PUT /admin/stock/{sku}, %d at a time", c.AdminWorkers)
	if c.SetupBatch > 0 {
		setup = fmt.Sprintf("PUT /admin/stock, up to %s SKUs a request", fmtInt(int64(c.SetupBatch)))
	}
	s := fmt.Sprintf("%s SKUs on sale, %s units each (%s), then %d keep-alive workers of the Go client ordering one unit at a time for %s, round robin over %d instances; each order's SKU is drawn from a Zipf distribution over the SKUs' ranks, P(rank k) ∝ (%s + k)^−%s (Go's math/rand/v2 Zipf), so that a handful of hot SKUs take most of the orders",
		fmtInt(int64(c.SKUs)), fmtInt(c.StockPerSKU), setup, c.Workers, c.Duration, c.Instances,
		strconv.FormatFloat(c.ZipfV, 'f', -1, 64), strconv.FormatFloat(c.ZipfS, 'f', -1, 64))
	if c.Top10Share > 0 {
		s += fmt.Sprintf(" (the ten hottest took %s of the requests)", fmtPercent(c.Top10Share))
	}
	return s + ". Then every SKU is audited, and every one must be exact"
}

// catalogKnee says, when some strategies' loads were raised step by step,
// how; "" otherwise.
func catalogKnee(r *Report) string {
	var knee, steps []string
	for _, c := range r.Catalogs() {
		if len(c.Knee) == 0 || slices.Contains(knee, c.Strategy) {
			continue
		}
		knee = append(knee, c.Strategy)
		if steps == nil {
			for _, k := range c.Knee {
				steps = append(steps, strconv.Itoa(k.Workers))
			}
		}
	}
	if len(knee) == 0 {
		return ""
	}
	return fmt.Sprintf("For %s the load is raised step by step (%s workers), each step on a catalog of its own, put on sale and audited like the others, until a step raises orders/s by less than %s over every step before it: then the service, not the client, bounds the figure. A row's figures are its step with the most orders/s; every step's orders/s is beside them, and a step that failed fails the row.",
		strings.Join(knee, ", "), strings.Join(steps, ", "), fmtPercent(KneeGain-1))
}

// fmtPercent writes a share as 42%, or 0.4% under one percent.
func fmtPercent(v float64) string {
	p := v * 100
	switch {
	case p == 0:
		return "0%"
	case p < 1:
		return strconv.FormatFloat(p, 'f', 1, 64) + "%"
	}
	return strconv.FormatFloat(p, 'f', 0, 64) + "%"
}
