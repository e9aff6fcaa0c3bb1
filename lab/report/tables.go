package report

import (
	"cmp"
	"fmt"
	"slices"
)

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
	// A round of which only orders/s is known (read back from a published
	// table, K6Figures.OrdersPerSecOnly) gives way to one with every
	// figure and the same orders/s: the table's rounding made them tie.
	partial := func(i int) bool { return runs[i].K6 != nil && runs[i].Summary == nil && runs[i].K6.OrdersPerSecOnly }
	if partial(mid) {
		for _, i := range order {
			if !partial(i) && stats[i].OrdersPerSec == stats[mid].OrdersPerSec {
				mid = i
				break
			}
		}
	}
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
