package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/flashsale/stock/internal/strategies"
)

// The cost goals (the "what it costs" issue), each checked in the run that
// measured it:
//   - a sold-out answer is no slower than a sale: in each burst, the p99 of
//     the 409 sold-out answers is at most the p99 of the 201s;
//   - a sold-out answer costs the service at most SoldOutCPUGoal times the
//     CPU of GET /healthz (both through the Go client);
//   - an order of batched or redis-reserve costs the service at most
//     FastPathCPUGoal times /healthz (each load generator against its own
//     /healthz run);
//   - in the ratio burst, redis-reserve sells at least RatioGoal times as
//     fast as conditional.
const (
	SoldOutCPUGoal  = 1.5
	FastPathCPUGoal = 1.5
	RatioGoal       = 5.0
)

// fastPaths are the strategies the fast-path goal is about.
var fastPaths = []string{strategies.NameBatched, strategies.NameRedisReserve}

// servicePerAnswer is the service's CPU per answer of c, in µs.
func servicePerAnswer(c *CPUCost) (float64, bool) {
	cc, ok := c.component(ComponentService)
	if !ok {
		return 0, false
	}
	return perOrder(cc.CPU, c.Answered)
}

// healthzService is the service's CPU per GET /healthz through the Go
// client (goClient) or k6, in µs.
func (r *Report) healthzService(goClient bool) (float64, bool) {
	switch {
	case goClient && r.GoLoadGen != nil && r.GoLoadGen.Cost != nil:
		return servicePerAnswer(r.GoLoadGen.Cost)
	case !goClient && r.LoadGen != nil && r.LoadGen.Cost != nil:
		return servicePerAnswer(r.LoadGen.Cost)
	}
	return 0, false
}

// goalMark says whether a goal is met: "yes", "no", or "–" unknown (the
// templates set "no" in bold).
func goalMark(known, met bool) string {
	switch {
	case !known:
		return "–"
	case met:
		return "yes"
	}
	return "no"
}

// soldOutGoalRow is one strategy's sold-out answers: their p99 beside the
// 201s' in its k6 burst (median round), and their service CPU in the Go
// client's sold-out run beside /healthz's.
type soldOutGoalRow struct {
	Backend, Strategy string
	Control           bool
	P99Sold, P99Out   string
	P99Met            string
	Answers           string
	Service, Healthz  string
	VsHealthz         string
	CPUMet            string
	RunP99            string
	Problems          string
	ProblemsRef       int
}

// healthzOf is the /healthz baseline of a Go client's run: the one
// measured beside it on the same instances, else the ceiling run's.
func (r *Report) healthzOf(g *GoBurst) (float64, bool) {
	if g != nil && g.Healthz != nil {
		if v, ok := servicePerAnswer(g.Healthz); ok {
			return v, true
		}
	}
	return r.healthzService(true)
}

func soldOutGoalRows(r *Report, burst []Row) []soldOutGoalRow {
	var out []soldOutGoalRow
	for _, row := range burst {
		st := row.Stats
		g := soldOutGoalRow{Backend: r.BackendLabel(row.Run.Backend), Strategy: row.Run.Strategy, Control: row.Control,
			P99Sold: fmtDur(st.P99Created), P99Out: fmtDur(st.P99SoldOut), Answers: "–", Service: "–", Healthz: "–", VsHealthz: "–", RunP99: "–"}
		g.P99Met = goalMark(st.P99Created > 0 && st.P99SoldOut > 0, st.P99SoldOut <= st.P99Created)
		var run *GoBurst
		for i := range r.SoldOutRuns {
			if s := &r.SoldOutRuns[i]; s.Backend == row.Run.Backend && s.Strategy == row.Run.Strategy {
				run = s
			}
		}
		known, met := false, false
		healthz, hok := r.healthzOf(run)
		if run != nil {
			g.Answers, g.RunP99 = fmtInt(run.SoldOut), fmtDur(run.P99)
			g.Problems = strings.Join(run.Problems(), "; ")
			if v, ok := servicePerAnswer(run.Cost); ok {
				g.Service = microsCell(v, true)
				if hok && healthz > 0 {
					g.Healthz = microsCell(healthz, true)
					g.VsHealthz = fmtRatio(v / healthz)
					known, met = true, v <= SoldOutCPUGoal*healthz
				}
			}
		}
		g.CPUMet = goalMark(known, met)
		out = append(out, g)
	}
	return out
}

// fastPathRow is the service's CPU per order of a fast strategy against
// /healthz's, through each load generator.
type fastPathRow struct {
	Backend, Strategy string
	Run               string
	Service, Healthz  string
	VsHealthz         string
	Met               string
}

func fastPathRows(r *Report, burst []Row) []fastPathRow {
	var out []fastPathRow
	add := func(backend, strategy, run string, cost *CPUCost, g *GoBurst) {
		f := fastPathRow{Backend: r.BackendLabel(backend), Strategy: strategy, Run: run, Service: "–", Healthz: "–", VsHealthz: "–"}
		v, ok := servicePerAnswer(cost)
		h, hok := r.healthzService(false)
		if g != nil {
			h, hok = r.healthzOf(g)
		}
		if ok {
			f.Service = microsCell(v, true)
		}
		if hok {
			f.Healthz = microsCell(h, true)
		}
		known := ok && hok && h > 0
		if known {
			f.VsHealthz = fmtRatio(v / h)
		}
		f.Met = goalMark(known, known && v <= FastPathCPUGoal*h)
		out = append(out, f)
	}
	for _, b := range r.Backends {
		for _, s := range fastPaths {
			for _, row := range burst {
				if row.Run.Backend == b && row.Run.Strategy == s && row.Run.Cost != nil {
					add(b, s, "burst (k6, median round)", row.Run.Cost, nil)
				}
			}
			for i := range r.GoBursts {
				if g := &r.GoBursts[i]; g.Backend == b && g.Strategy == s && g.Cost != nil && g.Round <= 1 {
					add(b, s, "burst (Go client, round 1)", g.Cost, g)
				}
			}
		}
	}
	return out
}

// ratioRow is one backend's ratio burst: each side's rate over its rounds,
// and the median of the pairs' ratios.
type ratioRow struct {
	Backend                  string
	Load                     string
	Numerator, Denominator   string // orders/s (201s to the last 201), median and rounds
	Ratio                    string
	Met                      string
	AnswersRatio             string // every answer over the whole burst
	NumP99, DenP99           string // 201 / sold out
	NumService, DenService   string // service µs per answer
	NumStrategy, DenStrategy string
	Problems                 string
	// ProblemsRef numbers Problems among the table's notes (0: none).
	ProblemsRef int
}

// The ratio burst compares these two: the Redis counter with its script
// against the database's one-statement deduction.
const (
	RatioNumerator   = strategies.NameRedisReserve
	RatioDenominator = strategies.NameConditional
)

// RatioPairs are the ratio burst's rounds of backend, paired by round:
// numerator (redis-reserve) and denominator (conditional).
func (r *Report) RatioPairs(backend string) (num, den []GoBurst) {
	byRound := map[int][2]*GoBurst{}
	for i := range r.RatioBursts {
		g := &r.RatioBursts[i]
		if g.Backend != backend || g.Round == 0 {
			continue
		}
		p := byRound[g.Round]
		switch g.Strategy {
		case RatioNumerator:
			p[0] = g
		case RatioDenominator:
			p[1] = g
		}
		byRound[g.Round] = p
	}
	rounds := make([]int, 0, len(byRound))
	for round := range byRound {
		rounds = append(rounds, round)
	}
	slices.Sort(rounds)
	for _, round := range rounds {
		if p := byRound[round]; p[0] != nil && p[1] != nil {
			num, den = append(num, *p[0]), append(den, *p[1])
		}
	}
	return num, den
}

// answersPerSec is every answer of g over the whole burst.
func answersPerSec(g GoBurst) float64 {
	if g.Duration <= 0 {
		return 0
	}
	return float64(g.Orders+g.SoldOut+g.Other) / g.Duration.Seconds()
}

func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ratioRows(r *Report) []ratioRow {
	var out []ratioRow
	for _, b := range r.Backends {
		num, den := r.RatioPairs(b)
		row := ratioRow{Backend: r.BackendLabel(b), NumStrategy: strategies.NameRedisReserve, DenStrategy: strategies.NameConditional}
		var problems []string
		for _, g := range r.RatioBursts {
			if g.Backend == b {
				for _, p := range g.Problems() {
					problems = append(problems, fmt.Sprintf("%s round %d: %s", g.Strategy, g.Round, p))
				}
			}
		}
		row.Problems = strings.Join(problems, "; ")
		if len(num) == 0 {
			if row.Problems != "" {
				out = append(out, row)
			}
			continue
		}
		row.Load = fmt.Sprintf("%s orders for %s units from %s clients", fmtInt(int64(num[0].Buyers)), fmtInt(num[0].Stock), fmtInt(int64(num[0].Workers)))
		var numRates, denRates, ratios, answerRatios []float64
		for i := range num {
			numRates, denRates = append(numRates, num[i].OrdersPerSec), append(denRates, den[i].OrdersPerSec)
			if den[i].OrdersPerSec > 0 {
				ratios = append(ratios, num[i].OrdersPerSec/den[i].OrdersPerSec)
			}
			if a := answersPerSec(den[i]); a > 0 {
				answerRatios = append(answerRatios, answersPerSec(num[i])/a)
			}
		}
		rates := func(v []float64) string {
			parts := make([]string, len(v))
			for i, x := range v {
				parts[i] = fmtRate(x)
			}
			return fmtRate(medianFloat(v)) + " (" + strings.Join(parts, " · ") + ")"
		}
		row.Numerator, row.Denominator = rates(numRates), rates(denRates)
		median := medianFloat(ratios)
		pairs := make([]string, len(ratios))
		for i, x := range ratios {
			pairs[i] = fmtRatio(x)
		}
		row.Ratio = fmtRatio(median) + " (" + strings.Join(pairs, " · ") + ")"
		row.Met = goalMark(len(ratios) > 0, median >= RatioGoal)
		row.AnswersRatio = fmtRatio(medianFloat(answerRatios))
		mid := medianPair(num, den)
		row.NumP99 = fmtDur(num[mid].P99Sold) + " / " + fmtDur(num[mid].P99SoldOut)
		row.DenP99 = fmtDur(den[mid].P99Sold) + " / " + fmtDur(den[mid].P99SoldOut)
		row.NumService, row.DenService = "–", "–"
		if v, ok := servicePerAnswer(num[mid].Cost); ok {
			row.NumService = microsCell(v, true)
		}
		if v, ok := servicePerAnswer(den[mid].Cost); ok {
			row.DenService = microsCell(v, true)
		}
		out = append(out, row)
	}
	return out
}

// medianPair is the index of the pair whose ratio is the median (the lower
// middle of an even count), for the figures shown beside it.
func medianPair(num, den []GoBurst) int {
	idx := make([]int, len(num))
	for i := range idx {
		idx[i] = i
	}
	ratio := func(i int) float64 {
		if den[i].OrdersPerSec <= 0 {
			return 0
		}
		return num[i].OrdersPerSec / den[i].OrdersPerSec
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(ratio(a), ratio(b)) })
	return idx[(len(idx)-1)/2]
}
