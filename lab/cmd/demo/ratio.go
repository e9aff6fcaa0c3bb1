package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/report"
)

// The ratio burst: how many times conditional's rate redis-reserve sells
// at, in one burst of RATIO_BUYERS one-unit orders for RATIO_STOCK units
// from RATIO_WORKERS keep-alive clients over the instances (the issue's
// figures: 9,000 orders, 3,000 units, 300 clients, three instances, a
// durable Redis). The two strategies run on instances of their own, both
// up at once, and take turns round by round, so that each pair is measured
// side by side on this shared machine; the report takes the median pair.

// ratioStrategies are the burst's two sides: the numerator first.
var ratioStrategies = []string{strategies.NameRedisReserve, strategies.NameConditional}

// runRatioBursts runs the ratio burst's rounds on b, when both strategies
// are in the run.
func (d *demo) runRatioBursts(ctx context.Context, b backend) {
	if ratioSteps(d.p) == 0 {
		return
	}
	d.progress.begin("%s · ratio burst: %s ÷ %s, %d rounds of %d orders for %d units from %d clients",
		b.Name, ratioStrategies[0], ratioStrategies[1], d.p.RatioRounds, d.p.RatioBuyers, d.p.RatioStock, d.p.RatioWorkers)
	fleets := make([]*fleet, len(ratioStrategies))
	defer func() {
		for _, f := range fleets {
			if f == nil {
				continue
			}
			if err := f.stop(); err != nil {
				d.progress.note("stopping the instances: %v", err)
			}
		}
	}()
	failed := func(strategy, why string) {
		d.progress.note("%s: %s", strategy, why)
		d.rep.RatioBursts = append(d.rep.RatioBursts, report.GoBurst{Backend: b.Name, Strategy: strategy, Error: why})
	}
	for i, s := range ratioStrategies {
		logDir := filepath.Join(d.dir, "runs", b.Name+"-"+s, "ratio")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			failed(s, err.Error())
			return
		}
		f, err := startFleet(ctx, d.p.StockBin, d.p.Instances, d.serviceEnv(b, s), logDir)
		if err != nil {
			failed(s, "instances did not start: "+err.Error())
			return
		}
		fleets[i] = f
	}
	stamp := time.Now().UTC().Format("150405")
	for round := 1; round <= d.p.RatioRounds && ctx.Err() == nil; round++ {
		for i, s := range ratioStrategies {
			f := fleets[i]
			g := report.GoBurst{
				Backend: b.Name, Strategy: s, Round: round,
				SKU:   fmt.Sprintf("ratio-%s-%s-%d", s, stamp, round),
				Stock: int64(d.p.RatioStock), Buyers: d.p.RatioBuyers, Workers: d.p.RatioWorkers, Warm: true,
			}
			d.sendGoBurst(ctx, f, &g, "the Go client's burst, from putting the units on sale (and connecting) to the last answer")
			d.rep.RatioBursts = append(d.rep.RatioBursts, g)
			d.progress.note("round %d, %s: %d sold in %s (%.0f orders/s), all %d answered in %s, p99 201 %s / sold out %s%s",
				round, s, g.Orders, g.SellWindow.Round(time.Millisecond), g.OrdersPerSec, g.Orders+g.SoldOut+g.Other,
				g.Duration.Round(time.Millisecond), g.P99Sold.Round(time.Millisecond), g.P99SoldOut.Round(time.Millisecond), problemsSuffix(g.Problems()))
		}
	}
}
