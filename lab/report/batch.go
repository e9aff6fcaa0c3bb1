package report

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// GoLoadGen is the second load generator's ceiling: lab/cmd/demo's own Go
// client (HTTP/1.1 keep-alive workers) against GET /healthz on the same
// instances as k6's. Beside k6's figure it tells whether a strategy's rate
// is bounded by the service or by the load generator.
type GoLoadGen struct {
	Workers        int           `json:"workers"`
	Duration       time.Duration `json:"duration_ns"`
	Requests       int64         `json:"requests"`
	RequestsPerSec float64       `json:"requests_per_sec"`
	P99            time.Duration `json:"p99_ns"`
	Error          string        `json:"error,omitempty"`
	// Cost is the CPU the run took, by process class (the Go client runs
	// in the demo's own process).
	Cost *CPUCost `json:"cost,omitempty"`
}

// GoBurst is the same burst as k6's (units, buyers, workers) sent by the Go
// client to one strategy's instances, on a SKU of its own.
type GoBurst struct {
	Backend  string `json:"backend"`
	Strategy string `json:"strategy"`
	Round    int    `json:"round,omitempty"`
	SKU      string `json:"sku"`
	Stock    int64  `json:"stock"`
	Buyers   int    `json:"buyers"`
	Workers  int    `json:"workers"`
	Orders   int64  `json:"orders"`
	SoldOut  int64  `json:"sold_out"`
	// Other is every answer but 201 and 409, transport errors included.
	Other int64 `json:"other"`
	// SellWindow runs from the start to the last 201.
	SellWindow   time.Duration `json:"sell_window_ns"`
	OrdersPerSec float64       `json:"orders_per_sec"`
	// Duration runs from the first order sent to the last answer.
	Duration time.Duration `json:"duration_ns,omitempty"`
	// P99 is over every answer, P99Sold over the 201s, P99SoldOut over
	// the 409s.
	P99        time.Duration `json:"p99_ns"`
	P99Sold    time.Duration `json:"p99_201_ns,omitempty"`
	P99SoldOut time.Duration `json:"p99_sold_out_ns,omitempty"`
	// Warm: every worker's connections were open before the clock started.
	Warm bool `json:"warm,omitempty"`
	// Healthz is the cost of as many GET /healthz from the same workers
	// on the same instances, right before: the baseline of this run.
	Healthz *CPUCost `json:"healthz,omitempty"`
	Audit   *Audit   `json:"audit,omitempty"`
	Error   string   `json:"error,omitempty"`
	// Cost is the CPU the burst took, by process class, from the start of
	// the sale to the last answer.
	Cost *CPUCost `json:"cost,omitempty"`
}

// Problems lists what makes a Go burst a failure: an audit that does not
// conserve the stock, more 201s than order rows, or a run that did not
// complete.
func (g GoBurst) Problems() []string {
	var out []string
	if g.Error != "" {
		out = append(out, "run failed: "+g.Error)
	}
	if g.Audit == nil {
		if g.Error == "" {
			out = append(out, "no audit")
		}
		return out
	}
	a := g.Audit
	if !a.Consistent || a.Initial != a.Available+a.Ordered || a.Available < 0 {
		out = append(out, fmt.Sprintf("audit: initial %d, available %d, ordered %d", a.Initial, a.Available, a.Ordered))
	}
	if g.Orders > a.Orders {
		out = append(out, fmt.Sprintf("%d buyers got 201 but have no order row", g.Orders-a.Orders))
	}
	return out
}

// Batches summarises the batched strategy's histograms scraped from the
// instances' /metrics after a run (stock_batch_size and
// stock_batch_tx_seconds, every outcome, every instance added up). The
// percentiles are bucket bounds: "at most this many orders".
type Batches struct {
	Count      int64         `json:"count"`
	Orders     float64       `json:"orders"`
	Mean       float64       `json:"mean"`
	P50Bound   float64       `json:"p50_bound"`
	P99Bound   float64       `json:"p99_bound"`
	Max        float64       `json:"max_bound"`
	TxMean     time.Duration `json:"tx_mean_ns"`
	TxP99Bound time.Duration `json:"tx_p99_bound_ns"`
}

// histogram is one Prometheus histogram added up over label sets.
type histogram struct {
	buckets map[float64]float64 // le → cumulative count
	sum     float64
	count   float64
}

// ParseBatchMetrics reads the Prometheus text of one or more instances and
// returns the batch histograms, nil when there is no batch in them.
func ParseBatchMetrics(texts ...io.Reader) (*Batches, error) {
	hs, err := readHistograms(texts, "stock_batch_size_", "stock_batch_tx_seconds_")
	if err != nil {
		return nil, err
	}
	size, tx := hs["stock_batch_size_"], hs["stock_batch_tx_seconds_"]
	if size.count == 0 {
		return nil, nil
	}
	b := &Batches{Count: int64(size.count), Orders: size.sum, Mean: size.sum / size.count}
	b.P50Bound, b.P99Bound, b.Max = size.quantile(0.5), size.quantile(0.99), size.quantile(1)
	if tx.count > 0 {
		b.TxMean = time.Duration(tx.sum / tx.count * float64(time.Second))
		b.TxP99Bound = time.Duration(tx.quantile(0.99) * float64(time.Second))
	}
	return b, nil
}

// readHistograms adds up, over every instance's Prometheus text and every
// label set, the histograms whose series names start with the prefixes
// (such as "stock_batch_size_"): one per prefix, empty when absent.
func readHistograms(texts []io.Reader, prefixes ...string) (map[string]*histogram, error) {
	hs := map[string]*histogram{}
	for _, p := range prefixes {
		hs[p] = &histogram{buckets: map[float64]float64{}}
	}
	for _, t := range texts {
		sc := bufio.NewScanner(t)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			var h *histogram
			var rest string
			for _, p := range prefixes {
				if strings.HasPrefix(line, p) {
					h, rest = hs[p], strings.TrimPrefix(line, p)
					break
				}
			}
			if h == nil {
				continue
			}
			sp := strings.LastIndexByte(rest, ' ')
			if sp < 0 {
				continue
			}
			v, err := strconv.ParseFloat(rest[sp+1:], 64)
			if err != nil {
				return nil, fmt.Errorf("metrics: %q: %w", line, err)
			}
			name := rest[:sp]
			switch {
			case strings.HasPrefix(name, "sum"):
				h.sum += v
			case strings.HasPrefix(name, "count"):
				h.count += v
			case strings.HasPrefix(name, "bucket"):
				i := strings.Index(name, `le="`)
				if i < 0 {
					continue
				}
				le := name[i+4:]
				le = le[:strings.IndexByte(le, '"')]
				bound, err := strconv.ParseFloat(le, 64)
				if err != nil {
					return nil, fmt.Errorf("metrics: %q: %w", line, err)
				}
				h.buckets[bound] += v
			}
		}
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// quantile is the upper bound of the bucket holding quantile q.
func (h histogram) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h.buckets))
	for b := range h.buckets {
		bounds = append(bounds, b)
	}
	slices.SortFunc(bounds, cmp.Compare)
	for _, b := range bounds {
		if h.buckets[b] >= q*h.count {
			return b
		}
	}
	return math.Inf(1)
}

// batchRow is one burst row of the "batches and load generators" table.
type batchRow struct {
	Backend, Strategy, Units, Buyers, Window     string
	K6Rate, K6Ratio, K6P99                       string
	GoRate, GoRatio, GoP99, GoProblems           string
	Batches, BatchMean, BatchP50, BatchP99, TxAv string
}

// batchRows lines up, for every burst row, k6's and the Go client's rates
// against their own /healthz ceilings, and the batch sizes.
func batchRows(r *Report, burst []Row) []batchRow {
	var out []batchRow
	for _, row := range burst {
		run := row.Run
		br := batchRow{
			Backend: r.BackendLabel(run.Backend), Strategy: run.Strategy,
			Units: fmtInt(run.Stock), Buyers: fmtInt(int64(run.Buyers)),
			Window: fmtDur(row.Stats.SellWindow),
			K6Rate: fmtRate(row.Stats.OrdersPerSec), K6Ratio: "–", K6P99: fmtDur(row.Stats.P99),
			GoRate: "–", GoRatio: "–", GoP99: "–",
			Batches: "–", BatchMean: "–", BatchP50: "–", BatchP99: "–", TxAv: "–",
		}
		if lg := r.LoadGen; lg != nil && lg.RequestsPerSec > 0 && row.Stats.OrdersPerSec > 0 {
			br.K6Ratio = fmt.Sprintf("%.2f×", row.Stats.OrdersPerSec/lg.RequestsPerSec)
		}
		if b := run.Batches; b != nil {
			br.Batches, br.BatchMean = fmtInt(b.Count), strconv.FormatFloat(b.Mean, 'f', 1, 64)
			br.BatchP50, br.BatchP99 = "≤ "+fmtBound(b.P50Bound), "≤ "+fmtBound(b.P99Bound)
			br.TxAv = fmtDur(b.TxMean)
		}
		for _, g := range r.GoBursts {
			if g.Backend != run.Backend || g.Strategy != run.Strategy || g.Round != run.Round {
				continue
			}
			br.GoRate, br.GoP99 = fmtRate(g.OrdersPerSec), fmtDur(g.P99)
			if lg := r.GoLoadGen; lg != nil && lg.RequestsPerSec > 0 && g.OrdersPerSec > 0 {
				br.GoRatio = fmt.Sprintf("%.2f×", g.OrdersPerSec/lg.RequestsPerSec)
			}
			br.GoProblems = strings.Join(g.Problems(), "; ")
		}
		out = append(out, br)
	}
	return out
}

func fmtBound(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
