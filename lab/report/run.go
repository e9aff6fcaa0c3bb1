package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/faults"
)

// Run is one k6 scenario against the instances of one strategy on one
// backend.
type Run struct {
	Backend  string `json:"backend"`
	Strategy string `json:"strategy"`
	Scenario string `json:"scenario"`
	SKU      string `json:"sku"`
	// The load offered: Stock units; for burst Buyers buyers on VUs
	// virtual users; for steady Rate orders/s for Duration with up to VUs
	// in flight.
	Stock    int64         `json:"stock"`
	Buyers   int           `json:"buyers,omitempty"`
	VUs      int           `json:"vus"`
	Rate     int           `json:"rate,omitempty"`
	Duration time.Duration `json:"duration_ns,omitempty"`
	// Instances is how many service processes shared the load.
	Instances int `json:"instances"`
	// Round numbers the repetitions of a scenario (1, 2, …); the runner
	// interleaves the strategies round by round, so that a slow spell of
	// the machine does not land on one strategy's every run.
	Round int `json:"round,omitempty"`
	// Command is the exact k6 command line.
	Command string `json:"command"`
	// Dir holds the run's files, relative to the report's directory:
	// summary.json, summary.txt, dashboard.html, k6.log, metrics-*.txt.
	Dir       string   `json:"dir"`
	Dashboard string   `json:"dashboard,omitempty"`
	Metrics   []string `json:"metrics,omitempty"`
	// Batches sums the batched strategy's batch histograms from Metrics.
	Batches *Batches `json:"batches,omitempty"`
	// Reserve is a redis-reserve or redis-watch burst's way to the
	// database.
	Reserve  *Reservations `json:"reserve,omitempty"`
	ExitCode int           `json:"exit_code"`
	// Error is set when the runner could not complete the run (an
	// instance died, k6 did not start, the audit did not answer).
	Error string        `json:"error,omitempty"`
	Wall  time.Duration `json:"wall_ns"`
	// Audit is GET /admin/audit/{sku} after the load stopped.
	Audit *Audit `json:"audit,omitempty"`
	// Cost is the CPU the run took, by process class, from the first
	// answer to the last; SellCost the same until the last 201 (the
	// selling, without a burst's sold-out tail), nil when none was sold.
	Cost     *CPUCost `json:"cost,omitempty"`
	SellCost *CPUCost `json:"sell_cost,omitempty"`
	// Summary is the k6 summary (Dir/summary.json), not serialised: the
	// run's folder is not published. K6 keeps what the report reads of it
	// (Save fills it in), so that results.json.gz alone renders the report
	// again, in a published copy too.
	Summary *Summary   `json:"-"`
	K6      *K6Figures `json:"k6,omitempty"`
}

// K6Figures are the figures the report reads from a run's k6 summary.
type K6Figures struct {
	Stats
	// Crossed lists the thresholds that failed ("metric expression").
	Crossed []string `json:"crossed_thresholds,omitempty"`
	// Source says where the figures came from when not from the summary
	// itself (runs saved before results.json.gz carried them).
	Source string `json:"source,omitempty"`
	// OrdersPerSecOnly: of this run only orders/s is known (a round that
	// was not the median one of a run whose figures were read back from
	// its published table). Its verdict then rests on the audit alone.
	OrdersPerSecOnly bool `json:"orders_per_sec_only,omitempty"`
}

// figures returns the k6 figures of a run: from its summary when loaded,
// else the saved ones; nil when there are none.
func (r *Run) figures() *K6Figures {
	if r.Summary != nil {
		return &K6Figures{Stats: r.Summary.stats(), Crossed: r.Summary.CrossedThresholds()}
	}
	return r.K6
}

// Audit is what GET /admin/audit/{sku} answered at the end of a run (the
// fault suite reads the same answer).
type Audit = faults.Audit

// IsControl reports whether a strategy is the unsafe control, whose
// oversell is the point of the demonstration rather than a failure.
func IsControl(strategy string) bool { return strategies.IsControl(strategy) }

// Stats are the numbers of one run, from its k6 summary.
type Stats struct {
	Requests int64 `json:"requests"`
	Orders   int64 `json:"orders"`
	SoldOut  int64 `json:"sold_out"`
	Busy     int64 `json:"busy"`
	Errors   int64 `json:"errors"`
	// Dropped are steady iterations that found no free VU: load the
	// service was offered but could not even be sent.
	Dropped int64 `json:"dropped,omitempty"`
	// SellWindow runs from the start of the load to the last 201,
	// AnswerWindow to the last answer of any kind.
	SellWindow   time.Duration `json:"sell_window_ns"`
	AnswerWindow time.Duration `json:"answer_window_ns"`
	// OrdersPerSec = Orders / SellWindow; RequestsPerSec = Requests /
	// AnswerWindow.
	OrdersPerSec   float64 `json:"orders_per_sec"`
	RequestsPerSec float64 `json:"requests_per_sec"`
	// Latency of POST /orders, every answer.
	P50        time.Duration `json:"p50_ns,omitempty"`
	P95        time.Duration `json:"p95_ns,omitempty"`
	P99        time.Duration `json:"p99_ns,omitempty"`
	HasLatency bool          `json:"has_latency,omitempty"`
	// The p99 of the 201s and of the 409s (sold out) alone, when the
	// load recorded them (loadtest/flashsale.js); 0 otherwise.
	P99Created time.Duration `json:"p99_201_ns,omitempty"`
	P99SoldOut time.Duration `json:"p99_sold_out_ns,omitempty"`
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// Stats computes the run's numbers; the zero Stats when there is neither
// a summary nor saved figures.
func (r *Run) Stats() Stats {
	if f := r.figures(); f != nil {
		return f.Stats
	}
	return Stats{}
}

// stats computes a run's numbers from its k6 summary.
func (s *Summary) stats() Stats {
	var st Stats
	st.Orders, st.SoldOut, st.Busy, st.Errors = s.Count("orders"), s.Count("sold_out"), s.Count("busy"), s.Count("errors")
	st.Dropped = s.Count("dropped_iterations")
	// Requests to /orders only: http_reqs also counts setup's and
	// teardown's admin calls.
	if n, ok := s.Value("order_latency", "count"); ok {
		st.Requests = int64(n)
	} else {
		st.Requests = st.Orders + st.SoldOut + st.Busy + st.Errors
	}
	if v, ok := s.Value("sold_at", "max"); ok {
		st.SellWindow = ms(v)
	}
	if v, ok := s.Value("answered_at", "max"); ok {
		st.AnswerWindow = ms(v)
	} else if s.State.TestRunDurationMs > 0 {
		st.AnswerWindow = ms(s.State.TestRunDurationMs)
	}
	if st.SellWindow <= 0 {
		st.SellWindow = st.AnswerWindow
	}
	// A window under 10 ms says more about the clock than about the
	// service: leave the rate unknown rather than print a huge number.
	if st.SellWindow >= 10*time.Millisecond {
		st.OrdersPerSec = float64(st.Orders) / st.SellWindow.Seconds()
	}
	if st.AnswerWindow >= 10*time.Millisecond {
		st.RequestsPerSec = float64(st.Requests) / st.AnswerWindow.Seconds()
	}
	if p50, ok := s.Value("order_latency", "med"); ok {
		st.HasLatency = true
		st.P50 = ms(p50)
		p95, _ := s.Value("order_latency", "p(95)")
		p99, _ := s.Value("order_latency", "p(99)")
		st.P95, st.P99 = ms(p95), ms(p99)
	}
	if v, ok := s.Value("order_latency_created", "p(99)"); ok {
		st.P99Created = ms(v)
	}
	if v, ok := s.Value("order_latency_sold_out", "p(99)"); ok {
		st.P99SoldOut = ms(v)
	}
	return st
}

// Status is the verdict on one run.
type Status string

const (
	// StatusOK: a safe strategy sold no unit twice and lost no order.
	StatusOK Status = "ok"
	// StatusFail: a safe strategy oversold or lost an order.
	StatusFail Status = "fail"
	// StatusError: the run did not complete; nothing can be concluded.
	StatusError Status = "error"
	// StatusControlOversold: the unsafe control oversold, as it should.
	StatusControlOversold Status = "control-oversold"
	// StatusControlHeld: the control happened not to oversell this time.
	StatusControlHeld Status = "control-held"
	// StatusUnsupported: the strategy's instances refused the scenario's
	// settings at start (the lifecycle's HOLD_TTL, as redis-reserve and
	// redis-watch did until issue 25's slice 5).
	StatusUnsupported Status = "unsupported"
)

// Verdict judges a run from the service's audit and the answers k6 saw.
type Verdict struct {
	Status Status
	// Oversold is units sold beyond the stock: the larger of ordered −
	// initial and −available, when positive.
	Oversold int64
	// Unrecorded is units that left the stock without an order row:
	// initial − available − ordered, when positive.
	Unrecorded int64
	// Unconfirmed is 201 answers that have no order row: buyers told
	// they bought, with nothing in the database. A lost order.
	Unconfirmed int64
	// Untold is order rows beyond the 201s that k6 saw (a buyer whose
	// answer was lost, e.g. 503 unavailable after a commit): allowed by
	// the contract, shown for completeness.
	Untold int64
	// Conserved: initial == available + ordered.
	Conserved bool
	// Problems explain a fail or an error, one sentence each.
	Problems []string
}

// Judge returns the verdict on a run.
func (r *Run) Judge() Verdict {
	var v Verdict
	k6 := r.figures()
	switch {
	case r.Error != "":
		// The runner's error says why the rest is missing.
		v.Problems = append(v.Problems, "run failed: "+r.Error)
	case k6 == nil && r.Audit == nil:
		v.Problems = append(v.Problems, "no k6 summary and no audit")
	case k6 == nil:
		v.Problems = append(v.Problems, "no k6 summary")
	case r.Audit == nil:
		v.Problems = append(v.Problems, "no audit")
	}
	if len(v.Problems) > 0 {
		v.Status = StatusError
		return v
	}
	a, st := r.Audit, k6.Stats
	v.Oversold = max(a.Ordered-a.Initial, -a.Available, 0)
	v.Unrecorded = max(a.Initial-a.Available-a.Ordered, 0)
	// Without k6's count of 201s (OrdersPerSecOnly) the answers cannot be
	// held against the order rows: the audit alone judges the run.
	if !k6.OrdersPerSecOnly {
		v.Unconfirmed = max(st.Orders-a.Orders, 0)
		v.Untold = max(a.Orders-st.Orders, 0)
	}
	v.Conserved = a.Initial == a.Available+a.Ordered

	var violations []string
	if v.Oversold > 0 {
		violations = append(violations, fmt.Sprintf("oversold %d units", v.Oversold))
	}
	if v.Unrecorded > 0 {
		violations = append(violations, fmt.Sprintf("%d units left the stock without an order", v.Unrecorded))
	}
	if v.Unconfirmed > 0 {
		violations = append(violations, fmt.Sprintf("%d buyers got 201 but have no order row", v.Unconfirmed))
	}
	if !v.Conserved && v.Unrecorded == 0 && v.Oversold == 0 {
		violations = append(violations, fmt.Sprintf("initial %d ≠ available %d + ordered %d", a.Initial, a.Available, a.Ordered))
	}
	crossed := k6.Crossed
	var k6Problems []string
	switch {
	case r.ExitCode == 99 && len(crossed) > 0:
		// A threshold crossed: the teardown saw a violation. The audit
		// above says which; if it saw none, the two disagree.
		if len(violations) == 0 {
			k6Problems = append(k6Problems, "k6 thresholds crossed ("+strings.Join(crossed, ", ")+") but the audit shows no violation")
		}
	case r.ExitCode != 0:
		k6Problems = append(k6Problems, fmt.Sprintf("k6 exited with status %d", r.ExitCode))
	}

	if IsControl(r.Strategy) {
		// The control is expected to violate the invariant; only a run
		// that did not work is a problem.
		v.Problems = append(violations, k6Problems...)
		if len(k6Problems) > 0 && len(violations) == 0 {
			v.Status = StatusError
		} else if v.Oversold > 0 {
			v.Status = StatusControlOversold
		} else {
			v.Status = StatusControlHeld
		}
		return v
	}
	v.Problems = append(violations, k6Problems...)
	switch {
	case len(violations) > 0:
		v.Status = StatusFail
	case len(k6Problems) > 0:
		v.Status = StatusError
	default:
		v.Status = StatusOK
	}
	return v
}
