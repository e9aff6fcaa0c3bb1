package report

import (
	_ "embed"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

func headline(r *Report, rows ...[]Row) string {
	a := auditedRuns(r, rows...)
	safe, held, lifecycles, controlOversold := a.safe, a.held, a.lifecycles, a.controlOversold
	var b strings.Builder
	if safe > 0 && held == safe {
		fmt.Fprintf(&b, "Every safe strategy passed the audit in all %d of its runs: no unit oversold, every unit sold is an order, every 201 has its order row", safe)
		if len(r.CatalogRuns) > 0 {
			b.WriteString(", on every SKU of the catalogs")
		}
		if lifecycles > 0 {
			b.WriteString("; in the lifecycle's sales, with orders paid, cancelled and left to lapse, the audit stayed consistent and every unit was paid for")
		}
		b.WriteString(".")
	} else if safe > 0 {
		fmt.Fprintf(&b, "%d of %d runs of safe strategies passed the audit; see the failures below.", held, safe)
	}
	if len(controlOversold) > 0 {
		fmt.Fprintf(&b, " The unsafe controls oversold %s, which is what the demonstration needs to show.", strings.Join(controlOversold, ", "))
	}
	b.WriteString(failoverHeadline(r))
	return strings.TrimSpace(b.String())
}

func findingOf(r *Report, backend string, burst []Row) finding {
	f := finding{Backend: r.BackendLabel(backend)}
	ref, hasRef := r.ReferenceCeiling(backend)
	for _, sc := range []string{Burst, Steady} {
		if b, ok := r.Best(backend, sc); ok {
			f.Lines = append(f.Lines, bestSentence(b, ref, hasRef))
		}
	}
	lines, control := catalogFinding(r, backend, burst)
	f.Lines, f.Control = append(f.Lines, lines...), append(f.Control, control...)
	for _, row := range burst {
		if row.Run.Backend != backend || !row.Control || row.Audit == nil {
			continue
		}
		a := row.Audit
		switch row.Verdict.Status {
		case StatusControlOversold:
			f.Control = append(f.Control, fmt.Sprintf("%s sold %s of %s units: %s oversold, stock left at %s.",
				row.Run.Strategy, fmtInt(a.Ordered), fmtInt(a.Initial), plural(row.Verdict.Oversold, "unit", "units"), fmtInt(a.Available)))
		case StatusControlHeld:
			f.Control = append(f.Control, fmt.Sprintf("%s did not oversell in this burst (a race it can lose, not a guarantee).", row.Run.Strategy))
		}
	}
	return f
}

// bestSentence says which strategy won a scenario and by how much.
func bestSentence(b Best, ref Ceiling, hasRef bool) string {
	w := b.Winner
	var s string
	if len(b.Tied) > 1 {
		var names []string
		for _, t := range b.Tied {
			names = append(names, t.Run.Strategy)
		}
		lo, hi := w.Stats.OrdersPerSec, w.Stats.OrdersPerSec
		for _, t := range b.Tied {
			lo, hi = min(lo, t.Stats.OrdersPerSec), max(hi, t.Stats.OrdersPerSec)
		}
		s = fmt.Sprintf("%s: %s tie at %s–%s orders/s (within %.0f%%)", b.Scenario, joinAnd(names), fmtRate(lo), fmtRate(hi), TieTolerance*100)
		if w.Run.Rate > 0 && w.Stats.OrdersPerSec >= float64(w.Run.Rate)*(1-TieTolerance) {
			s = fmt.Sprintf("%s: %s all served the %s orders/s offered", b.Scenario, joinAnd(names), fmtInt(int64(w.Run.Rate)))
		}
		s += fmt.Sprintf("; %s has the lowest p99, %s", w.Run.Strategy, fmtDur(w.Stats.P99))
		switch {
		case b.RunnerUp == nil || b.P99Factor <= 0:
		case b.P99Factor < 1+TieTolerance:
			s += fmt.Sprintf(", about the same as %s's %s", b.RunnerUp.Run.Strategy, fmtDur(b.RunnerUp.Stats.P99))
		default:
			s += fmt.Sprintf(", %s lower than %s's %s", fmtRatio(b.P99Factor), b.RunnerUp.Run.Strategy, fmtDur(b.RunnerUp.Stats.P99))
		}
	} else {
		s = fmt.Sprintf("%s: %s is the fastest safe strategy, %s orders/s", b.Scenario, w.Run.Strategy, fmtRate(w.Stats.OrdersPerSec))
		if b.RunnerUp != nil {
			s += fmt.Sprintf(", %s the next, %s (%s)", fmtRatio(b.Factor), b.RunnerUp.Run.Strategy, fmtRate(b.RunnerUp.Stats.OrdersPerSec))
			if overlap(w.RoundsPerSec, b.RunnerUp.RoundsPerSec) {
				s += ", though their rounds overlap: within this run's noise"
			}
		}
	}
	if hasRef && w.HasRatio {
		s += fmt.Sprintf("; %s the reference ceiling, %s", fmtRatio(w.Ratio), refName(ref))
	}
	return s + "."
}

// overlap reports whether two sets of rounds (two or more each) share part
// of their range: then the difference between their medians is noise.
func overlap(a, b []float64) bool {
	if len(a) < 2 || len(b) < 2 {
		return false
	}
	return slices.Min(a) <= slices.Max(b) && slices.Min(b) <= slices.Max(a)
}

func joinAnd(names []string) string {
	switch len(names) {
	case 0:
		return ""
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func tableRows(r *Report, rows []Row) []tableRow {
	var out []tableRow
	for i, row := range rows {
		t := tableRowOf(r, row)
		t.First = i == 0 || rows[i-1].Run.Backend != row.Run.Backend
		if c, ok := r.ReferenceCeiling(row.Run.Backend); ok && t.First {
			t.CeilingName = refName(c)
		}
		out = append(out, t)
	}
	return out
}

func tableRowOf(r *Report, row Row) tableRow {
	st, v, run := row.Stats, row.Verdict, row.Run
	t := tableRow{
		Backend: run.Backend, BackendLabel: r.BackendLabel(run.Backend), Strategy: run.Strategy,
		Orders:         fmtInt(st.Orders),
		Requests:       fmtInt(st.Requests),
		OrdersPerSec:   fmtRate(st.OrdersPerSec),
		RequestsPerSec: fmtRate(st.RequestsPerSec),
		Window:         fmtSeconds(st.SellWindow),
		SoldOut:        fmtInt(st.SoldOut), Busy: fmtInt(st.Busy), Errors: fmtInt(st.Errors),
		Dropped:      fmtInt(st.Dropped),
		Conservation: conservationText(v),
		Status:       StatusText(v),
		StatusClass:  string(v.Status),
		Problems:     strings.Join(v.Problems, "; "),
		Dashboard:    run.Dashboard,
		Dir:          run.Dir,
		Control:      row.Control,
		Bad:          v.Status == StatusFail || v.Status == StatusError,
	}
	if run.Rate > 0 {
		t.Offered = fmtInt(int64(run.Rate)) + "/s"
	}
	if len(row.RoundsPerSec) > 1 {
		var parts []string
		for _, v := range row.RoundsPerSec {
			parts = append(parts, fmtRate(v))
		}
		t.Spread = strings.Join(parts, " · ")
	}
	if st.HasLatency {
		t.P50, t.P95, t.P99 = fmtMillis(st.P50), fmtMillis(st.P95), fmtMillis(st.P99)
	} else {
		t.P50, t.P95, t.P99 = "–", "–", "–"
	}
	t.P99Split = "–"
	if st.P99Created > 0 || st.P99SoldOut > 0 {
		t.P99Split = fmtMillis(st.P99Created) + " / " + fmtMillis(st.P99SoldOut)
	}
	if row.Audit != nil {
		t.Available = fmtInt(row.Audit.Available)
		t.Oversold = fmtInt(v.Oversold)
		t.OversoldRed = v.Oversold > 0
		t.AvailableRed = row.Audit.Available < 0
	} else {
		t.Available, t.Oversold = "–", "–"
	}
	if v.Untold > 0 {
		t.Untold = plural(v.Untold, "order", "orders") + " committed whose buyer did not get a 201"
	}
	t.Ratio = "–"
	if row.HasRatio {
		t.Ratio = fmtRatio(row.Ratio)
	}
	return t
}

func backendViewOf(r *Report, backend string, burst, steady []Row) backendView {
	v := backendView{Name: backend, Label: r.BackendLabel(backend)}
	var refs []refLine
	ref, hasRef := r.ReferenceCeiling(backend)
	if hasRef {
		v.HasCeiling = true
		v.ceilingValue = ref.PerSecond
		v.CeilingText = fmt.Sprintf("%s/s", fmtRate(ref.PerSecond))
		refs = append(refs, refLine{Label: ceilingLabel(ref) + " (reference: the × in brackets)", Value: ref.PerSecond, Class: "ref-ceiling"})
	}
	for _, c := range r.MedianCeilings() {
		if c.Backend == backend && c.Error == "" && c.PerSecond > 0 && c.PerSecond != v.ceilingValue {
			refs = append(refs, refLine{Label: ceilingLabel(c), Value: c.PerSecond, Class: "ref-other"})
		}
	}

	byStrategy := func(rows []Row) map[string]Row {
		m := map[string]Row{}
		for _, row := range rows {
			if row.Run.Backend == backend {
				m[row.Run.Strategy] = row
			}
		}
		return m
	}
	b, s := byStrategy(burst), byStrategy(steady)

	orders := chart{
		Width:  1240,
		Title:  fmt.Sprintf("%s: successful orders per second", v.Label),
		Unit:   "orders/s",
		Refs:   refs,
		Legend: []legendItem{{"burst (until sold out)", "b-burst"}, {"steady (open model)", "b-steady"}, {"naive control", "b-control"}},
	}
	latency := chart{
		Title:  fmt.Sprintf("%s: latency of POST /orders (burst)", v.Label),
		Unit:   "milliseconds, log scale",
		Log:    true,
		Legend: []legendItem{{"p50", "b-p50"}, {"p95", "b-p95"}, {"p99", "b-p99"}},
	}
	steadyLatency := latency
	steadyLatency.Title = fmt.Sprintf("%s: latency of POST /orders (steady)", v.Label)
	// Each strategy's units sold as a share of its own stock: the bursts
	// sized up to last BURST_MIN_SECONDS sell tens of thousands of units,
	// beside which a 300-unit bar would not show.
	oversell := chart{
		Title:   fmt.Sprintf("%s: units sold in the burst, as a share of each strategy's own stock", v.Label),
		Unit:    "% of the strategy's stock",
		Stacked: true,
		Legend:  []legendItem{{"sold within the stock", "b-sold"}, {"oversold", "b-control"}},
		Format:  func(v float64) string { return fmtTick(v) + "%" },
		Refs:    []refLine{{Label: "the stock: 100%", Value: 100, Class: "ref-stock"}},
	}
	// Bursts sized to last BURST_MIN_SECONDS sell more units than the
	// others: their rate is comparable, the sale is not the same, and the
	// chart says so on the rows and under its title.
	usual := usualStock(b)
	var sized []string
	for _, name := range r.Strategies {
		br, hasB := b[name]
		sr, hasS := s[name]
		if !hasB && !hasS {
			continue
		}
		control := IsControl(name)
		class := ""
		if control {
			class = "control"
		}
		row := barRow{Label: name, Class: class}
		if hasB && usual > 0 && br.Run.Stock != usual {
			row.Sub = "burst: " + fmtInt(br.Run.Stock) + " units"
			sized = append(sized, name)
		}
		burstClass, steadyClass := "b-burst", "b-steady"
		if control {
			burstClass, steadyClass = "b-control", "b-control2"
		}
		if hasB {
			row.Bars = append(row.Bars, bar{Value: br.Stats.OrdersPerSec, Text: fmtRate(br.Stats.OrdersPerSec) + ratioSuffix(br, ref), Title: "burst: " + fmtRate(br.Stats.OrdersPerSec) + " orders/s", Class: burstClass})
		}
		if hasS {
			row.Bars = append(row.Bars, bar{Value: sr.Stats.OrdersPerSec, Text: fmtRate(sr.Stats.OrdersPerSec) + ratioSuffix(sr, ref), Title: "steady: " + fmtRate(sr.Stats.OrdersPerSec) + " orders/s", Class: steadyClass})
		}
		orders.Rows = append(orders.Rows, row)
		latRow := func(rr Row) barRow {
			lr := barRow{Label: name, Class: class}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			for _, q := range []struct {
				name  string
				d     time.Duration
				class string
			}{{"p50", rr.Stats.P50, "b-p50"}, {"p95", rr.Stats.P95, "b-p95"}, {"p99", rr.Stats.P99, "b-p99"}} {
				c := q.class
				if control {
					c += " control"
				}
				lr.Bars = append(lr.Bars, bar{Value: ms(q.d), Text: fmtDur(q.d), Title: q.name + " " + fmtDur(q.d), Class: c})
			}
			return lr
		}
		if hasB && br.Stats.HasLatency {
			latency.Rows = append(latency.Rows, latRow(br))
		}
		if hasS && sr.Stats.HasLatency {
			steadyLatency.Rows = append(steadyLatency.Rows, latRow(sr))
		}
		if hasB && br.Audit != nil && br.Audit.Initial > 0 {
			oversell.Rows = append(oversell.Rows, soldShareRow(name, class, br.Audit, br.Verdict.Oversold))
		}
	}
	if len(sized) > 0 {
		orders.Note = fmt.Sprintf("Bursts of different sizes: %s sold the units under their names, the others %s units each (the same %s buyers per unit).",
			joinAnd(sized), fmtInt(usual), fmtTick(max(r.BuyersPerUnit, 1)))
	}
	v.Orders, v.BurstLatency, v.SteadyLatency, v.Oversell = orders.render(), latency.render(), steadyLatency.render(), oversell.render()
	return v
}

// usualStock is the burst size most strategies of a backend had (of a tie,
// the smaller), 0 without bursts.
func usualStock(rows map[string]Row) int64 {
	count := map[int64]int{}
	for _, row := range rows {
		count[row.Run.Stock]++
	}
	var usual int64
	for stock, n := range count {
		if n > count[usual] || (n == count[usual] && stock < usual) {
			usual = stock
		}
	}
	return usual
}

// soldShareRow is one strategy's bar of the proof chart: the units it sold
// within its stock and beyond it, as percentages of that stock, with the
// units themselves in the text.
func soldShareRow(name, class string, a *Audit, over int64) barRow {
	share := func(n int64) float64 { return 100 * float64(n) / float64(a.Initial) }
	within := min(a.Ordered, a.Initial)
	text := fmt.Sprintf("%s: %s of %s units", fmtShare(share(a.Ordered)), fmtInt(a.Ordered), fmtInt(a.Initial))
	if over > 0 {
		text += ", " + fmtInt(over) + " oversold"
	}
	bars := []bar{{Value: share(within), Text: text, Title: fmtInt(within) + " sold within the stock of " + fmtInt(a.Initial), Class: "b-sold"}}
	if over > 0 {
		bars = append(bars, bar{Value: share(over), Title: fmtInt(over) + " units oversold", Class: "b-control"})
	}
	return barRow{Label: name, Sub: fmtInt(a.Initial) + " units", Class: class, Bars: bars}
}

// fmtShare writes a percentage: 100%, 115%, 99.7%.
func fmtShare(p float64) string {
	if p == float64(int64(p)) || p >= 1000 {
		return fmtInt(int64(p)) + "%"
	}
	return strconv.FormatFloat(p, 'f', 1, 64) + "%"
}

func ceilingLabel(c Ceiling) string {
	conns := "connections"
	if c.Workers == 1 {
		conns = "connection"
	}
	return fmt.Sprintf("hot row, %s, %d %s: %s/s", c.Statement, c.Workers, conns, fmtRate(c.PerSecond))
}

func roundLabel(rounds, round int) string {
	if rounds <= 1 || round == 0 {
		return ""
	}
	return fmt.Sprintf(" · round %d", round)
}

func ratioSuffix(r Row, ref Ceiling) string {
	if !r.HasRatio {
		return ""
	}
	return " (" + fmtRatio(r.Ratio) + " " + ref.Statement + "'s)"
}

// refName names a reference ceiling where a "× ceiling" figure is given:
// which statement, from how many connections, how fast. A backend's
// ceilings differ by statement and connections (PostgreSQL's for-update on
// as many connections as the instances hold, 471/s in the published run,
// against conditional on one, 1,889/s), so the figure says which.
func refName(c Ceiling) string {
	return fmt.Sprintf("%s on %s (%s/s)", c.Statement, plural(int64(c.Workers), "connection", "connections"), fmtRate(c.PerSecond))
}
