package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// KneeGain is how much a step of a catalog's knee must raise orders/s over
// every step before it for the next step to run: below it, the curve has
// flattened and the service, not the client, bounds the figure.
const KneeGain = 1.10

// KneeStep is one step of a catalog's knee: the same load at Workers
// workers, on a catalog of its own put on sale for it, every SKU audited.
type KneeStep struct {
	Workers        int           `json:"workers"`
	Requests       int64         `json:"requests"`
	Orders         int64         `json:"orders"`
	OrdersPerSec   float64       `json:"orders_per_sec"`
	RequestsPerSec float64       `json:"requests_per_sec"`
	P99            time.Duration `json:"p99_ns"`
	Audited        int           `json:"audited"`
	Exact          int           `json:"exact"`
	SKUsOrdered    int           `json:"skus_ordered"`
	Status         Status        `json:"status"`
	Problems       []string      `json:"problems,omitempty"`
	Dir            string        `json:"dir,omitempty"`
}

// KneeRising reports whether the last of steps (in the order run) raised
// orders/s by KneeGain over every step before it.
func KneeRising(steps []*Catalog) bool {
	if len(steps) < 2 {
		return true
	}
	last := steps[len(steps)-1]
	for _, s := range steps[:len(steps)-1] {
		if last.OrdersPerSec < KneeGain*s.OrdersPerSec {
			return false
		}
	}
	return true
}

// KneeFigure returns the step that stands for a catalog whose load was
// raised step by step: the one with the most orders/s, or the first that
// failed its audit or run (a failure is never hidden behind a faster
// step), with every step's figures and verdict in its Knee. One step is
// returned as it is.
func KneeFigure(steps []*Catalog) *Catalog {
	if len(steps) == 0 {
		return nil
	}
	if len(steps) == 1 {
		return steps[0]
	}
	var figure *Catalog
	knee := make([]KneeStep, len(steps))
	for i, s := range steps {
		v := s.Judge()
		knee[i] = KneeStep{Workers: s.Workers, Requests: s.Requests, Orders: s.Orders, OrdersPerSec: s.OrdersPerSec, RequestsPerSec: s.RequestsPerSec,
			P99: s.P99, Audited: s.Audited, Exact: s.Exact, SKUsOrdered: s.SKUsOrdered, Status: v.Status, Problems: v.Problems, Dir: s.Dir}
		switch {
		case figure == nil:
			figure = s
		case !figure.passed(): // a failure stays the figure
		case !s.passed(), s.OrdersPerSec > figure.OrdersPerSec:
			figure = s
		}
	}
	figure.Knee = knee
	return figure
}

// passed: the run's own verdict is not a failure.
func (c *Catalog) passed() bool {
	switch c.judgeRun().Status {
	case StatusFail, StatusError:
		return false
	}
	return true
}

// KneeAt returns the fewest workers whose step came within KneeGain of the
// best orders/s: where the curve flattens. 0 without a knee.
func (c *Catalog) KneeAt() int {
	best := 0.0
	for _, s := range c.Knee {
		best = max(best, s.OrdersPerSec)
	}
	for _, s := range c.Knee {
		if s.OrdersPerSec*KneeGain >= best {
			return s.Workers
		}
	}
	return 0
}

// kneeProblems are the problems of the knee's steps other than the figure's
// own: a step that failed fails the catalog.
func (c *Catalog) kneeProblems() (violations, broken []string) {
	for _, s := range c.Knee {
		if s.Workers == c.Workers {
			continue
		}
		for _, p := range s.Problems {
			p = fmt.Sprintf("at %d workers: %s", s.Workers, p)
			if s.Status == StatusFail {
				violations = append(violations, p)
			} else if s.Status == StatusError {
				broken = append(broken, p)
			}
		}
	}
	return violations, broken
}

// kneeText writes the knee's steps in one line, "100 → 1,150 · 200 →
// 1,380 …" (workers → orders/s), the figure's step marked with mark, and
// every step passed through each when it is not nil (to keep a step on
// one line of a narrow cell).
func (c *Catalog) kneeText(mark, each func(string) string) string {
	if len(c.Knee) == 0 {
		return ""
	}
	parts := make([]string, len(c.Knee))
	for i, s := range c.Knee {
		parts[i] = fmt.Sprintf("%d → %s", s.Workers, fmtRate(s.OrdersPerSec))
		if s.Status == StatusFail || s.Status == StatusError {
			parts[i] += " (" + string(s.Status) + ")"
		}
		switch {
		case s.Workers == c.Workers:
			parts[i] = mark(parts[i])
		case each != nil:
			parts[i] = each(parts[i])
		}
	}
	return strings.Join(parts, " · ")
}

// The catalog's goals (issue 38), each in the run that measured it: across
// the catalog, batched and redis-reserve (one Redis) sell at least
// CatalogVsBurstGoal times their own burst on one hot SKU and
// CatalogVsConditionalGoal times conditional's catalog, at a database CPU
// per 201 at most CatalogDBCPUGoal times their burst's.
const (
	CatalogVsBurstGoal       = 1.0
	CatalogVsConditionalGoal = 3.0
	CatalogDBCPUGoal         = 2.0
)

// catalogGoalRow is one fast strategy's catalog against its goals.
type catalogGoalRow struct {
	Backend, Strategy                   string
	OrdersPerSec, VsBurst, VsBurstMet   string
	VsConditional, VsConditionalMet     string
	DBPerSold, DBVsBurst, DBMet, KneeAt string
}

func catalogGoalRows(r *Report, burst []Row) []catalogGoalRow {
	burstOf := map[string]Row{}
	for _, row := range burst {
		burstOf[row.Run.Backend+" "+row.Run.Strategy] = row
	}
	catalogOf := map[string]*Catalog{}
	for _, c := range r.Catalogs() {
		if k := c.Backend + " " + c.Strategy; c.RedisMasters <= 1 && catalogOf[k] == nil && c.Judge().Status == StatusOK {
			catalogOf[k] = c
		}
	}
	var out []catalogGoalRow
	for _, b := range r.Backends {
		cond := catalogOf[b+" "+strategies.NameConditional]
		for _, s := range fastPaths {
			c := catalogOf[b+" "+s]
			if c == nil {
				continue
			}
			g := catalogGoalRow{Backend: r.BackendLabel(b), Strategy: s, OrdersPerSec: fmtRate(c.OrdersPerSec),
				VsBurst: "–", VsConditional: "–", DBPerSold: "–", DBVsBurst: "–", KneeAt: "–"}
			if len(c.Knee) > 0 {
				g.KneeAt = fmt.Sprintf("%d workers", c.KneeAt())
			}
			hot, hasBurst := burstOf[b+" "+s]
			known := hasBurst && hot.Stats.OrdersPerSec > 0
			if known {
				v := c.OrdersPerSec / hot.Stats.OrdersPerSec
				g.VsBurst = fmtRatio(v)
				g.VsBurstMet = goalMark(true, v >= CatalogVsBurstGoal)
			} else {
				g.VsBurstMet = goalMark(false, false)
			}
			if cond != nil && cond.OrdersPerSec > 0 {
				v := c.OrdersPerSec / cond.OrdersPerSec
				g.VsConditional, g.VsConditionalMet = fmtRatio(v), goalMark(true, v >= CatalogVsConditionalGoal)
			} else {
				g.VsConditionalMet = goalMark(false, false)
			}
			g.DBMet = goalMark(false, false)
			if cat, ok := dbPerSold(c.Cost); ok {
				g.DBPerSold = fmt.Sprintf("%.0f µs", cat)
				if hasBurst && hot.Run != nil {
					if h, ok := dbPerSold(hot.Run.SellCost); ok && h > 0 {
						g.DBVsBurst, g.DBMet = fmtRatio(cat/h), goalMark(true, cat <= CatalogDBCPUGoal*h)
					}
				}
			}
			out = append(out, g)
		}
	}
	return out
}
