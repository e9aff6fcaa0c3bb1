// Package report turns the results of a demo run (k6 summaries, the
// service's audits, the measured ceilings) into verdicts and ratios, and
// renders them as a self-contained HTML page and a Markdown file.
//
// It does no I/O beyond reading the files it is pointed at and writing the
// ones it is asked to: the runner (cmd/demo) measures, this package judges
// and presents, so the judgement can be unit-tested on fixed summaries.
package report

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// Scenarios, as loadtest/lib/profiles.js names them.
const (
	Burst  = "burst"
	Steady = "steady"
)

// Report is everything one demo run found.
type Report struct {
	Title    string    `json:"title"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Mode is "default" or "quick" (DEMO_QUICK=1).
	Mode     string      `json:"mode"`
	Env      Environment `json:"environment"`
	Settings []Setting   `json:"settings"`
	// Commands rerun the whole comparison.
	Commands []string `json:"commands"`
	// LoadGen is the load generator's ceiling, nil if it was not measured.
	LoadGen *LoadGen `json:"load_generator,omitempty"`
	// GoLoadGen is the second load generator's ceiling (cmd/demo's Go
	// client against /healthz), GoBursts its bursts against the fastest
	// strategies.
	GoLoadGen *GoLoadGen `json:"go_load_generator,omitempty"`
	GoBursts  []GoBurst  `json:"go_bursts,omitempty"`
	// BuyersPerUnit is the one ratio of buyers to units of every burst.
	BuyersPerUnit float64   `json:"buyers_per_unit,omitempty"`
	Ceilings      []Ceiling `json:"ceilings"`
	Runs          []*Run    `json:"runs"`
	// CatalogRuns are the catalog scenario's runs (many SKUs, a few of
	// them hot), Catalogs in table order.
	CatalogRuns []*Catalog `json:"catalogs,omitempty"`
	// Notes are the runner's warnings, shown as they are.
	Notes []string `json:"notes,omitempty"`
	// Rounds is how often the burst ran per strategy and backend.
	Rounds int `json:"rounds,omitempty"`
	// Strategies and Backends fix the order of rows and charts.
	Strategies []string `json:"strategies"`
	Backends   []string `json:"backends"`
	// Faults is the latest fault-suite run, nil when make faults has not
	// run on this machine.
	Faults *Faults `json:"faults,omitempty"`
}

// Environment describes the machine and the software, so that a reader can
// tell whether their own numbers are comparable.
type Environment struct {
	Host      string `json:"host"`
	CPU       string `json:"cpu"`
	Cores     int    `json:"cores"`
	Memory    string `json:"memory"`
	OS        string `json:"os"`
	Go        string `json:"go"`
	K6        string `json:"k6"`
	Postgres  string `json:"postgres,omitempty"`
	MySQL     string `json:"mysql,omitempty"`
	Redis     string `json:"redis,omitempty"`
	Etcd      string `json:"etcd,omitempty"`      // etcd-lock's, when it ran
	ZooKeeper string `json:"zookeeper,omitempty"` // zk-lock's, when it ran
	GitCommit string `json:"git_commit"`
	// LoadAtStart and LoadAtEnd are /proc/loadavg when the run began and
	// ended: a load above the core count means something else was
	// running, and the figures are noisier than usual.
	LoadAtStart string `json:"load_at_start,omitempty"`
	LoadAtEnd   string `json:"load_at_end,omitempty"`
	// DBSettings are the database settings that decide hot-row speed
	// (synchronous_commit, innodb_flush_log_at_trx_commit, …).
	DBSettings []Setting `json:"db_settings,omitempty"`
}

// Setting is one knob of the run and why it has its value.
type Setting struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Note  string `json:"note,omitempty"`
}

// LoadGen is k6 against GET /healthz on the same instances: the most
// requests per second this machine pushes through HTTP at all.
type LoadGen struct {
	RequestsPerSec float64       `json:"requests_per_sec"`
	Requests       int64         `json:"requests"`
	VUs            int           `json:"vus"`
	Duration       time.Duration `json:"duration_ns"`
	P99            time.Duration `json:"p99_ns"`
	Command        string        `json:"command"`
	Dir            string        `json:"dir"`
	Dashboard      string        `json:"dashboard,omitempty"`
	Error          string        `json:"error,omitempty"`
}

// Ceiling is the hot-row ceiling of one statement on one backend, measured
// without the service (internal/hotrow).
type Ceiling struct {
	Backend   string        `json:"backend"`
	Statement string        `json:"statement"`
	SQL       string        `json:"sql"`
	Workers   int           `json:"workers"`
	Duration  time.Duration `json:"duration_ns"`
	Committed int64         `json:"committed"`
	Failed    int64         `json:"failed"`
	PerSecond float64       `json:"per_second"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Error     string        `json:"error,omitempty"`
	// Round numbers the measurements of one statement: the runner
	// measures the ceilings again before each round of bursts.
	Round int `json:"round,omitempty"`
	// RoundsPerSec is every round's figure, set on the medians that
	// MedianCeilings returns.
	RoundsPerSec []float64 `json:"-"`
}

// MedianCeilings returns one ceiling per backend, statement and connection
// count: the round with the median rate (of an even count, the lower),
// carrying every round's rate in RoundsPerSec. Failed measurements count
// only when no round succeeded.
func (r *Report) MedianCeilings() []Ceiling {
	type key struct {
		backend, statement string
		workers            int
	}
	groups := map[key][]Ceiling{}
	var keys []key
	for _, c := range r.Ceilings {
		k := key{c.Backend, c.Statement, c.Workers}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], c)
	}
	var out []Ceiling
	for _, k := range keys {
		var ok []Ceiling
		for _, c := range groups[k] {
			if c.Error == "" && c.PerSecond > 0 {
				ok = append(ok, c)
			}
		}
		if len(ok) == 0 {
			out = append(out, groups[k][0])
			continue
		}
		rounds := slices.Clone(ok)
		slices.SortStableFunc(rounds, func(a, b Ceiling) int { return cmp.Compare(a.Round, b.Round) })
		slices.SortStableFunc(ok, func(a, b Ceiling) int { return cmp.Compare(a.PerSecond, b.PerSecond) })
		m := ok[(len(ok)-1)/2]
		m.RoundsPerSec = nil
		for _, c := range rounds {
			m.RoundsPerSec = append(m.RoundsPerSec, c.PerSecond)
		}
		out = append(out, m)
	}
	return out
}

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
	// Summary is the k6 summary (Dir/summary.json), not serialised.
	Summary *Summary `json:"-"`
}

// Audit is the service's bookkeeping of a sale.
type Audit struct {
	SKU        string `json:"sku"`
	Initial    int64  `json:"initial"`
	Available  int64  `json:"available"`
	Ordered    int64  `json:"ordered"`
	Orders     int64  `json:"orders"`
	Consistent bool   `json:"consistent"`
	// Pending counts accepted orders not yet in the database
	// (redis-reserve, redis-watch).
	Pending int64 `json:"pending,omitempty"`
	// Drift says how the database disagrees with where the stock is
	// counted (redis-reserve, redis-watch), "" when it does not.
	Drift string `json:"drift,omitempty"`
}

// IsControl reports whether a strategy is the unsafe control, whose
// oversell is the point of the demonstration rather than a failure.
func IsControl(strategy string) bool { return inventory.IsControl(strategy) }

// Stats are the numbers of one run, from its k6 summary.
type Stats struct {
	Requests, Orders, SoldOut, Busy, Errors int64
	// Dropped are steady iterations that found no free VU: load the
	// service was offered but could not even be sent.
	Dropped int64
	// SellWindow runs from the start of the load to the last 201,
	// AnswerWindow to the last answer of any kind.
	SellWindow, AnswerWindow time.Duration
	// OrdersPerSec = Orders / SellWindow; RequestsPerSec = Requests /
	// AnswerWindow.
	OrdersPerSec, RequestsPerSec float64
	// Latency of POST /orders, every answer.
	P50, P95, P99 time.Duration
	HasLatency    bool
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// Stats computes the run's numbers; the zero Stats when there is no summary.
func (r *Run) Stats() Stats {
	var st Stats
	s := r.Summary
	if s == nil {
		return st
	}
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
	switch {
	case r.Error != "":
		// The runner's error says why the rest is missing.
		v.Problems = append(v.Problems, "run failed: "+r.Error)
	case r.Summary == nil && r.Audit == nil:
		v.Problems = append(v.Problems, "no k6 summary and no audit")
	case r.Summary == nil:
		v.Problems = append(v.Problems, "no k6 summary")
	case r.Audit == nil:
		v.Problems = append(v.Problems, "no audit")
	}
	if len(v.Problems) > 0 {
		v.Status = StatusError
		return v
	}
	a, st := r.Audit, r.Stats()
	v.Oversold = max(a.Ordered-a.Initial, -a.Available, 0)
	v.Unrecorded = max(a.Initial-a.Available-a.Ordered, 0)
	v.Unconfirmed = max(st.Orders-a.Orders, 0)
	v.Untold = max(a.Orders-st.Orders, 0)
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
	crossed := r.Summary.CrossedThresholds()
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

// Row is one strategy on one backend in one scenario, with everything a
// table shows about it. With several rounds, the speed is the median
// round's and the safety the worst round's.
type Row struct {
	// Run is the median round (by orders/s), whose figures Stats are.
	Run   *Run
	Stats Stats
	// Verdict judges every round: a violation in any of them counts.
	// Its figures (oversold, …) are the worst over the rounds.
	Verdict Verdict
	// Audit is the audit of the worst round (the most oversold), the one
	// the oversell chart and the final-available column show.
	Audit *Audit
	// Rounds are all the rounds' runs, in round order; OrdersPerSec
	// theirs.
	Rounds       []*Run
	RoundsPerSec []float64
	// Ratio is OrdersPerSec divided by the backend's hot-row ceiling;
	// HasRatio is false when either is unknown.
	Ratio    float64
	HasRatio bool
	Control  bool
}

// ReferenceCeiling is the hot-row ceiling a backend's strategies are judged
// against: of the median ceilings, the fastest statement measured from as
// many connections as the
// service's instances use together (the largest worker count measured on
// the backend), i.e. the most orders per second one row allows with the
// service's own SQL at the service's concurrency. A ceiling measured from
// fewer connections (the serial one) is shown beside it, not used as the
// reference.
func (r *Report) ReferenceCeiling(backend string) (Ceiling, bool) {
	medians := r.MedianCeilings()
	workers := 0
	for _, c := range medians {
		if c.Backend == backend && c.Error == "" && c.PerSecond > 0 {
			workers = max(workers, c.Workers)
		}
	}
	var best Ceiling
	found := false
	for _, c := range medians {
		if c.Backend == backend && c.Error == "" && c.PerSecond > 0 && c.Workers == workers && (!found || c.PerSecond > best.PerSecond) {
			best, found = c, true
		}
	}
	return best, found
}

// Rows returns one row per backend and strategy for a scenario, in table
// order: backends, then strategies, in the order of r.Backends and
// r.Strategies.
func (r *Report) Rows(scenario string) []Row {
	type key struct{ backend, strategy string }
	groups := map[key][]*Run{}
	var keys []key
	for _, run := range r.Runs {
		if run.Scenario != scenario {
			continue
		}
		k := key{run.Backend, run.Strategy}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], run)
	}
	var rows []Row
	for _, k := range keys {
		row := rowOf(groups[k])
		if c, ok := r.ReferenceCeiling(k.backend); ok && row.Stats.OrdersPerSec > 0 {
			row.Ratio, row.HasRatio = row.Stats.OrdersPerSec/c.PerSecond, true
		}
		rows = append(rows, row)
	}
	slices.SortStableFunc(rows, func(a, b Row) int {
		return cmp.Or(
			cmp.Compare(indexOr(r.Backends, a.Run.Backend), indexOr(r.Backends, b.Run.Backend)),
			cmp.Compare(indexOr(r.Strategies, a.Run.Strategy), indexOr(r.Strategies, b.Run.Strategy)),
		)
	})
	return rows
}

// rowOf summarises the rounds of one strategy on one backend.
func rowOf(runs []*Run) Row {
	runs = slices.Clone(runs)
	slices.SortStableFunc(runs, func(a, b *Run) int { return cmp.Compare(a.Round, b.Round) })
	row := Row{Rounds: runs, Control: IsControl(runs[0].Strategy)}
	stats := make([]Stats, len(runs))
	for i, run := range runs {
		stats[i] = run.Stats()
		row.RoundsPerSec = append(row.RoundsPerSec, stats[i].OrdersPerSec)
	}
	// The median round by orders/s; of an even count, the lower one.
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(stats[a].OrdersPerSec, stats[b].OrdersPerSec) })
	mid := order[(len(order)-1)/2]
	row.Run, row.Stats = runs[mid], stats[mid]
	row.Verdict, row.Audit = judgeRounds(runs, runs[mid])
	return row
}

// judgeRounds combines the verdicts of a strategy's rounds: a safe strategy
// fails if any round failed, errs if any round erred; the control oversold
// if any round shows it. The figures are the worst over the rounds.
func judgeRounds(runs []*Run, median *Run) (Verdict, *Audit) {
	var v Verdict
	audit := median.Audit
	v.Conserved = true
	var fail, errs, oversold, held, ok int
	for _, run := range runs {
		rv := run.Judge()
		prefix := ""
		if len(runs) > 1 {
			prefix = fmt.Sprintf("round %d: ", run.Round)
		}
		for _, p := range rv.Problems {
			v.Problems = append(v.Problems, prefix+p)
		}
		switch rv.Status {
		case StatusFail:
			fail++
		case StatusError:
			errs++
			continue
		case StatusControlOversold:
			oversold++
		case StatusControlHeld:
			held++
		case StatusOK:
			ok++
		}
		if rv.Oversold > v.Oversold || (audit == nil && run.Audit != nil) {
			audit = run.Audit
		}
		v.Oversold = max(v.Oversold, rv.Oversold)
		v.Unrecorded = max(v.Unrecorded, rv.Unrecorded)
		v.Unconfirmed = max(v.Unconfirmed, rv.Unconfirmed)
		v.Untold = max(v.Untold, rv.Untold)
		v.Conserved = v.Conserved && rv.Conserved
	}
	switch {
	case fail > 0:
		v.Status = StatusFail
	case oversold > 0:
		v.Status = StatusControlOversold
	case errs > 0:
		v.Status = StatusError
	case held > 0:
		v.Status = StatusControlHeld
	default:
		v.Status = StatusOK
	}
	if errs == len(runs) {
		v.Conserved = false
	}
	return v, audit
}

func indexOr(list []string, s string) int {
	if i := slices.Index(list, s); i >= 0 {
		return i
	}
	return len(list)
}

// Best is the fastest safe strategy of a backend in a scenario, and how it
// compares with the next one.
type Best struct {
	Backend, Scenario string
	Winner            Row
	// RunnerUp is the next strategy: the next fastest, or, when the
	// throughputs tie, the tied one with the next lowest p99.
	RunnerUp *Row
	// Factor is Winner's orders/s over RunnerUp's (0 without a runner-up).
	Factor float64
	// Tied lists the strategies whose orders/s are within TieTolerance of
	// the winner's, winner included, by p99; the winner is then the one
	// with the lowest p99, and P99Factor is RunnerUp's p99 over Winner's.
	Tied      []Row
	P99Factor float64
}

// TieTolerance: two throughputs closer than this fraction are a tie (in
// the steady scenario, every strategy that keeps up serves exactly the
// offered rate; the difference is then in latency).
const TieTolerance = 0.03

// Best returns the best safe strategy on a backend in a scenario, among runs
// whose verdict is ok: the most orders per second, ties broken by the
// lowest p99. False when there is none.
func (r *Report) Best(backend, scenario string) (Best, bool) {
	var ok []Row
	for _, row := range r.Rows(scenario) {
		if row.Run.Backend == backend && !row.Control && row.Verdict.Status == StatusOK && row.Stats.OrdersPerSec > 0 {
			ok = append(ok, row)
		}
	}
	if len(ok) == 0 {
		return Best{}, false
	}
	slices.SortStableFunc(ok, func(a, b Row) int { return cmp.Compare(b.Stats.OrdersPerSec, a.Stats.OrdersPerSec) })
	top := ok[0].Stats.OrdersPerSec
	n := 1
	for n < len(ok) && ok[n].Stats.OrdersPerSec >= top*(1-TieTolerance) {
		n++
	}
	b := Best{Backend: backend, Scenario: scenario}
	if n > 1 {
		b.Tied = slices.Clone(ok[:n])
		slices.SortStableFunc(b.Tied, func(x, y Row) int { return cmp.Compare(x.Stats.P99, y.Stats.P99) })
		copy(ok, b.Tied)
	}
	b.Winner = ok[0]
	if len(ok) > 1 {
		b.RunnerUp = &ok[1]
		b.Factor = ok[0].Stats.OrdersPerSec / ok[1].Stats.OrdersPerSec
		if n > 1 && ok[0].Stats.P99 > 0 {
			b.P99Factor = float64(ok[1].Stats.P99) / float64(ok[0].Stats.P99)
		}
	}
	return b, true
}

// Failures lists why the demo must exit non-zero: a safe strategy that
// oversold or lost an order, a run that did not complete, a ceiling that
// could not be measured. An oversold control is not a failure.
func (r *Report) Failures() []string {
	var out []string
	for _, sc := range []string{Burst, Steady} {
		for _, row := range r.Rows(sc) {
			for _, run := range row.Rounds {
				v := run.Judge()
				if v.Status != StatusFail && v.Status != StatusError {
					continue
				}
				name := fmt.Sprintf("%s/%s %s", run.Backend, run.Strategy, sc)
				if len(row.Rounds) > 1 {
					name += fmt.Sprintf(" round %d", run.Round)
				}
				for _, p := range v.Problems {
					out = append(out, name+": "+p)
				}
			}
		}
	}
	for _, c := range r.Ceilings {
		if c.Error != "" {
			name := fmt.Sprintf("hot-row ceiling %s/%s from %d connections", c.Backend, c.Statement, c.Workers)
			if c.Round > 0 {
				name += fmt.Sprintf(" round %d", c.Round)
			}
			out = append(out, name+": "+c.Error)
		}
	}
	if r.LoadGen != nil && r.LoadGen.Error != "" {
		out = append(out, "load generator ceiling: "+r.LoadGen.Error)
	}
	if r.GoLoadGen != nil && r.GoLoadGen.Error != "" {
		out = append(out, "Go load generator ceiling: "+r.GoLoadGen.Error)
	}
	for _, g := range r.GoBursts {
		for _, p := range g.Problems() {
			out = append(out, fmt.Sprintf("%s/%s burst from the Go client round %d: %s", g.Backend, g.Strategy, g.Round, p))
		}
	}
	for _, c := range r.Catalogs() {
		if v := c.Judge(); v.Status == StatusFail || v.Status == StatusError {
			for _, p := range v.Problems {
				out = append(out, fmt.Sprintf("%s/%s catalog: %s", c.Backend, c.Label(), p))
			}
		}
	}
	return out
}

// resultsFile is where Save writes the report's data, beside the pages.
const resultsFile = "results.json"

// Save writes the report's data as results.json in dir; Load reads it back
// with the k6 summaries, so a report can be rendered again.
func (r *Report) Save(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, resultsFile), append(b, '\n'), 0o644)
}

// Load reads dir/results.json and every run's summary.json.
func Load(dir string) (*Report, error) {
	b, err := os.ReadFile(filepath.Join(dir, resultsFile))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: %s: %w", resultsFile, err)
	}
	for _, run := range r.Runs {
		if run.Dir == "" {
			continue
		}
		s, err := ReadSummary(filepath.Join(dir, run.Dir, "summary.json"))
		switch {
		case err == nil:
			run.Summary = s
		case !errors.Is(err, fs.ErrNotExist):
			return nil, err
		}
	}
	return &r, nil
}

// round rounds to n significant digits, for figures in prose.
func round(v float64, n int) float64 {
	if v == 0 {
		return 0
	}
	p := math.Pow(10, float64(n)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}
