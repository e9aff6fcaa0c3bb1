package report

import (
	"fmt"
	"html/template"
	"strconv"
)

// catalogChart draws orders/s across the catalog beside the one-hot-SKU
// burst, per strategy, on one backend.
func catalogChart(r *Report, backend string, burst []Row) template.HTML {
	ch := chart{
		Width:  1240,
		Title:  fmt.Sprintf("%s: orders per second across the catalog, beside the burst on one hot SKU", r.BackendLabel(backend)),
		Unit:   "orders/s",
		Legend: []legendItem{{"catalog (Zipf over many SKUs)", "b-catalog"}, {"burst (one hot SKU, k6)", "b-burst"}},
	}
	burstOf := map[string]Row{}
	for _, row := range burst {
		if row.Run.Backend == backend {
			burstOf[row.Run.Strategy] = row
		}
	}
	// The control's swatch only where a control's bars are drawn (found
	// in a headless Chromium check: a swatch that matched no bar).
	for _, c := range r.Catalogs() {
		if c.Backend == backend && IsControl(c.Strategy) {
			ch.Legend = append(ch.Legend, legendItem{"control", "b-control"})
			break
		}
	}
	for _, c := range r.Catalogs() {
		if c.Backend != backend {
			continue
		}
		control := IsControl(c.Strategy)
		row := barRow{Label: c.Strategy}
		if c.RedisMasters > 1 {
			row.Sub = fmt.Sprintf("Redis Cluster, %d masters", c.RedisMasters)
		} else if c.RedisMasters == 1 {
			row.Sub = "one Redis"
		}
		catClass, burstClass := "b-catalog", "b-burst"
		if control {
			row.Class, catClass, burstClass = "control", "b-control", "b-control2"
		}
		row.Bars = append(row.Bars, bar{Value: c.OrdersPerSec, Text: fmtRate(c.OrdersPerSec), Title: "catalog: " + fmtRate(c.OrdersPerSec) + " orders/s", Class: catClass})
		if b, ok := burstOf[c.Strategy]; ok {
			row.Bars = append(row.Bars, bar{Value: b.Stats.OrdersPerSec, Text: fmtRate(b.Stats.OrdersPerSec), Title: "burst: " + fmtRate(b.Stats.OrdersPerSec) + " orders/s", Class: burstClass})
		}
		ch.Rows = append(ch.Rows, row)
	}
	return ch.render()
}

// catalogFinding is the backend card's lines on the catalog: the fastest
// safe strategy across it, against its own burst; and the controls' worst
// SKUs.
func catalogFinding(r *Report, backend string, burst []Row) (lines, control []string) {
	var best *Catalog
	for _, c := range r.Catalogs() {
		if c.Backend != backend {
			continue
		}
		v := c.Judge()
		if IsControl(c.Strategy) {
			if v.Status == StatusControlOversold && c.Worst != nil {
				control = append(control, fmt.Sprintf("catalog: %s oversold %s of %s SKUs; the worst, %s.",
					c.Strategy, fmtInt(int64(c.Audited-c.Exact)), fmtInt(int64(c.Audited)), c.Worst.Describe()))
			}
			continue
		}
		if v.Status == StatusOK && (best == nil || c.OrdersPerSec > best.OrdersPerSec) {
			best = c
		}
	}
	if best != nil {
		s := fmt.Sprintf("catalog (%s SKUs, Zipf s=%s): %s is the fastest safe strategy, %s orders/s across the catalog",
			fmtInt(int64(best.SKUs)), strconv.FormatFloat(best.ZipfS, 'f', -1, 64), best.Label(), fmtRate(best.OrdersPerSec))
		for _, row := range burst {
			if row.Run.Backend == backend && row.Run.Strategy == best.Strategy && row.Stats.OrdersPerSec > 0 {
				s += fmt.Sprintf(", %s its burst on one hot SKU (%s/s)", fmtRatio(best.OrdersPerSec/row.Stats.OrdersPerSec), fmtRate(row.Stats.OrdersPerSec))
			}
		}
		lines = append(lines, s+".")
	}
	return lines, control
}
