package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/flashsale/stock/lab/report"
)

// runLifecycleGoShape is the lifecycle's burst in the peers' shape
// (report.LifecycleGoShape): one instance with HOLD_TTL and
// PER_USER_LIMIT=1 and one without, both up at once, the Go client's
// RATIO_BUYERS orders for RATIO_STOCK units from RATIO_WORKERS keep-alive
// workers to one, then the other, LIFECYCLE_GO_ROUNDS times. Each burst
// is audited. Only for the strategies of LIFECYCLE_GO_STRATEGIES.
func (d *demo) runLifecycleGoShape(ctx context.Context, b backend, strategy string, l *report.Lifecycle, runDir string) {
	p := d.p
	if p.LifecycleGoRounds == 0 || !slices.Contains(p.LifecycleGoStrategies, strategy) {
		return
	}
	g := &report.LifecycleGoShape{
		Instances: 1, Stock: int64(p.RatioStock), Buyers: p.RatioBuyers, Workers: p.RatioWorkers,
		HoldTTL: p.LifecycleBurstHold, PerUserLimit: 1,
	}
	l.GoShape = g
	sides := []struct {
		name string
		env  []string
		out  *[]*report.GoBurst
	}{
		{"off", d.serviceEnv(b, strategy), &g.Off},
		{"on", d.lifecycleEnv(b, strategy, p.LifecycleBurstHold), &g.On},
	}
	fleets := make([]*fleet, len(sides))
	defer func() {
		for i, f := range fleets {
			if f != nil {
				d.stopFleet(f, fmt.Sprintf("%s-%s lifecycle Go shape %s", b.Name, strategy, sides[i].name))
			}
		}
	}()
	for i, side := range sides {
		dir := filepath.Join(runDir, "go-shape-"+side.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			g.Error = err.Error()
			return
		}
		f, err := startFleet(ctx, p.StockBin, 1, side.env, dir)
		if err != nil {
			g.Error = side.name + ": instance did not start: " + err.Error()
			d.progress.note("%s", g.Error)
			return
		}
		fleets[i] = f
	}
	stamp := time.Now().UTC().Format("150405")
	for round := 1; round <= p.LifecycleGoRounds && ctx.Err() == nil; round++ {
		for i, side := range sides {
			burst := &report.GoBurst{
				Backend: b.Name, Strategy: strategy, Round: round,
				SKU:   trimSKU(fmt.Sprintf("lcg-%s-%s-%s-%d-%s", stamp, b.Name[:2], strategy, round, side.name)),
				Stock: g.Stock, Buyers: g.Buyers, Workers: g.Workers, Warm: true,
			}
			d.sendGoBurst(ctx, fleets[i], burst, "the Go client's burst on one instance, from putting the units on sale (and connecting) to the last answer")
			*side.out = append(*side.out, burst)
			if side.name == "on" {
				d.dropHolds(ctx, fleets[i], burst.SKU)
			}
			d.progress.note("Go client, one instance, round %d, lifecycle %s: %d sold in %s, all %d answered in %s (%.0f units/s)%s",
				round, side.name, burst.Orders, burst.SellWindow.Round(time.Millisecond), burst.Orders+burst.SoldOut+burst.Other,
				burst.Duration.Round(time.Millisecond), report.AnsweredRate(burst), problemsSuffix(burst.Problems()))
		}
	}
	if answered, sell := g.Ratios(); answered > 0 {
		d.progress.note("Go client, one instance: on ÷ off %.2f× (every buyer answered), %.2f× (sell window)", answered, sell)
	}
}

// dropHolds starts sku's sale again with no units once a burst with long
// holds is measured and audited: that deletes its orders, whose holds
// would otherwise lapse minutes later, in the middle of another
// strategy's measurement, and be swept by whichever instances sweep then
// (found measuring this shape: the sweep of an earlier run's lapsed holds
// took 5% of the instance's CPU). A failure is only noted.
func (d *demo) dropHolds(ctx context.Context, f *fleet, sku string) {
	client := goClient(1, 1)
	defer client.CloseIdleConnections()
	if err := startSale(ctx, client, f.urls()[0], d.p.AdminToken, sku, 0); err != nil {
		d.progress.note("dropping the holds of %s: %v", sku, err)
	}
}
