package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LifecycleGoShape is the lifecycle's burst in the shape the peers were
// measured in (../shared/BASELINES.md): one instance, the Go client's
// keep-alive workers, Buyers one-unit orders of distinct buyers for Stock
// units, with HOLD_TTL=HoldTTL and PER_USER_LIMIT=PerUserLimit (On) and
// without them (Off), two instances up at once (one each) taking turns,
// Off then On, round by round. Two thirds of its buyers are refused: what
// a sold-out answer costs with the lifecycle on shows here, where the
// three-instance k6 burst, a quarter of whose buyers win, hides it.
type LifecycleGoShape struct {
	Instances    int           `json:"instances"`
	Stock        int64         `json:"stock"`
	Buyers       int           `json:"buyers"`
	Workers      int           `json:"workers"`
	HoldTTL      time.Duration `json:"hold_ttl_ns"`
	PerUserLimit int           `json:"per_user_limit"`
	On           []*GoBurst    `json:"on,omitempty"`
	Off          []*GoBurst    `json:"off,omitempty"`
	Error        string        `json:"error,omitempty"`
}

// AnsweredRate is a burst's units sold over the time until every buyer had
// an answer (first order sent to last answer): what the sale's buyers
// wait for, the sold-out answers included. 0 when it did not run clean.
func AnsweredRate(g *GoBurst) float64 {
	if g == nil || len(g.Problems()) > 0 || g.Duration <= 0 {
		return 0
	}
	return float64(g.Orders) / g.Duration.Seconds()
}

// SellRate is a burst's units over its sell window (to the last 201), 0
// when it did not run clean.
func SellRate(g *GoBurst) float64 {
	if g == nil || len(g.Problems()) > 0 {
		return 0
	}
	return g.OrdersPerSec
}

// median of rate over bursts that have one (the lower of an even count).
func medianRate(bursts []*GoBurst, rate func(*GoBurst) float64) float64 {
	var rs []float64
	for _, g := range bursts {
		if r := rate(g); r > 0 {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return 0
	}
	slices.SortFunc(rs, cmp.Compare)
	return rs[(len(rs)-1)/2]
}

// Ratios are the medians of On over those of Off: every buyer answered,
// and the sell window alone; 0 where a side has none.
func (g *LifecycleGoShape) Ratios() (answered, sell float64) {
	ratio := func(rate func(*GoBurst) float64) float64 {
		on, off := medianRate(g.On, rate), medianRate(g.Off, rate)
		if on == 0 || off == 0 {
			return 0
		}
		return on / off
	}
	return ratio(AnsweredRate), ratio(SellRate)
}

// goShapeCell fills row's Go-client columns from l's shape.
func goShapeCell(row *lifecycleRow, g *LifecycleGoShape) {
	if g == nil {
		row.GoShape = "–"
		return
	}
	if g.Error != "" && len(g.On) == 0 {
		row.GoShape, row.GoShapeLow = "failed: "+g.Error, true
		return
	}
	answered, sell := g.Ratios()
	if answered == 0 {
		row.GoShape, row.GoShapeLow = "–", true
		row.GoShapeDetail = strings.Join(goShapeProblems(g), "; ")
		return
	}
	row.GoShape = strconv.FormatFloat(answered, 'f', 2, 64) + "×"
	row.GoShapeLow = answered < LifecycleGoal
	var rounds []string
	for i := range max(len(g.On), len(g.Off)) {
		rate := func(bs []*GoBurst) string {
			if i < len(bs) {
				if r := AnsweredRate(bs[i]); r > 0 {
					return fmtRate(r)
				}
			}
			return "–"
		}
		rounds = append(rounds, rate(g.On)+" / "+rate(g.Off))
	}
	row.GoShapeDetail = fmt.Sprintf("%s / %s orders/s; sell window %s×; rounds %s",
		fmtRate(medianRate(g.On, AnsweredRate)), fmtRate(medianRate(g.Off, AnsweredRate)),
		strconv.FormatFloat(sell, 'f', 2, 64), strings.Join(rounds, " · "))
	if p := goShapeProblems(g); len(p) > 0 {
		row.GoShapeDetail += "; " + strings.Join(p, "; ")
	}
}

// goShapeProblems are the rounds that did not run clean, by side.
func goShapeProblems(g *LifecycleGoShape) []string {
	var out []string
	for _, side := range []struct {
		name   string
		bursts []*GoBurst
	}{{"on", g.On}, {"off", g.Off}} {
		for i, b := range side.bursts {
			if p := b.Problems(); len(p) > 0 {
				out = append(out, fmt.Sprintf("round %d %s: %s", i+1, side.name, strings.Join(p, ", ")))
			}
		}
	}
	return out
}

// lifecycleGoShapeLoad describes the Go client's one-instance burst, from
// the first run that has one.
func lifecycleGoShapeLoad(r *Report) string {
	for _, l := range r.Lifecycles() {
		if g := l.GoShape; g != nil {
			return fmt.Sprintf("%s one-unit orders of distinct buyers for %s units from %d keep-alive workers against %d instance, with HOLD_TTL=%s and PER_USER_LIMIT=%d and without them, two instances up at once taking turns (without, then with) for %d rounds, the median of each side",
				fmtInt(int64(g.Buyers)), fmtInt(g.Stock), g.Workers, g.Instances, g.HoldTTL, g.PerUserLimit, max(len(g.On), len(g.Off)))
		}
	}
	return ""
}

// judge is what the shape's bursts add to the lifecycle's verdict: a
// burst that failed, and every unit oversold, every audit not consistent
// and every 201 without an order row (violations).
func (g *LifecycleGoShape) judge() (broken, violations []string, oversold int64) {
	if g.Error != "" {
		broken = append(broken, "the Go client's one-instance burst: "+g.Error)
	}
	for _, side := range []struct {
		name   string
		bursts []*GoBurst
	}{{"on", g.On}, {"off", g.Off}} {
		for i, b := range side.bursts {
			what := fmt.Sprintf("the Go client's one-instance burst %s (round %d)", side.name, i+1)
			if b.Error != "" {
				broken = append(broken, what+": "+b.Error)
			}
			a := b.Audit
			if a == nil {
				continue
			}
			over := max(a.Ordered-a.Initial-a.Restocked, -a.Available, 0)
			oversold = max(oversold, over)
			switch {
			case over > 0:
				violations = append(violations, fmt.Sprintf("%s oversold %d units", what, over))
			case !a.Consistent:
				violations = append(violations, "the audit of "+what+" is not consistent")
			}
			if b.Orders > a.Orders {
				violations = append(violations, fmt.Sprintf("%s: %d buyers got 201 but have no order row", what, b.Orders-a.Orders))
			}
		}
	}
	return broken, violations, oversold
}
