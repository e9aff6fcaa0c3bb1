package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"

	"github.com/flashsale/stock/internal/dburl"
	"github.com/flashsale/stock/lab/report"
)

// The lifecycle scenario: orders that come back (HOLD_TTL, PER_USER_LIMIT;
// docs/api.md). After round 1 of each strategy in LIFECYCLE_STRATEGIES, on
// fresh instances (the settings are the instances' environment):
//
//  1. the demo's k6 burst (flashsale.js, the same units, buyers and VUs
//     as the strategy's burst) with HOLD_TTL=LIFECYCLE_BURST_HOLD_TTL and
//     PER_USER_LIMIT=1, then the same burst without them, for the ratio;
//     and for LIFECYCLE_GO_STRATEGIES the same pair in the peers' shape,
//     one instance and the Go client (lifecycle_goshape.go);
//  2. loadtest/lifecycle.js's sale with holds of LIFECYCLE_HOLD_TTL, swept
//     every LIFECYCLE_SWEEP_EVERY: buyers pay, cancel or let their hold
//     lapse, some click twice, the rest retry until every unit is paid.
//     Then the audit, once no hold is left, and the order rows: how soon a
//     returned unit was sold again, and whether any buyer holds more than
//     the limit.
//
// A strategy whose instances refuse the settings at start (redis-reserve
// and redis-watch did until issue 25's slice 5) gets a row that says so,
// with the instance's own line, and nothing else runs for it. The
// instances decide, not a list here, so a strategy that learns to take
// holds gets its full row without a change to the demo.

// lifecycleStrategies are the strategies the lifecycle scenario runs for,
// in the plan's order: LIFECYCLE_STRATEGIES, or every strategy.
func lifecycleStrategies(p plan) []string {
	if !p.Lifecycle {
		return nil
	}
	if len(p.LifecycleStrategies) == 0 {
		return p.Strategies
	}
	var out []string
	for _, s := range p.Strategies {
		for _, want := range p.LifecycleStrategies {
			if s == want {
				out = append(out, s)
			}
		}
	}
	return out
}

// refusal returns the line in which an instance that exited before it was
// ready refused a setting as not supported, and whether there was one.
// bin/stock prints its configuration errors on one line, separated by
// "; ", and exits.
func refusal(err error) (string, bool) {
	for _, line := range strings.Split(err.Error(), "\n") {
		for _, part := range strings.Split(line, "; ") {
			if strings.Contains(part, "not supported") {
				return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(part), "stock: invalid configuration:")), true
			}
		}
	}
	return "", false
}

// lifecycleEnv is the instances' environment for the lifecycle, holds of
// hold.
func (d *demo) lifecycleEnv(b backend, strategy string, hold time.Duration) []string {
	return append(d.serviceEnv(b, strategy),
		"HOLD_TTL="+hold.String(),
		"HOLD_SWEEP_EVERY="+d.p.LifecycleSweepEvery.String(),
		"PER_USER_LIMIT=1")
}

// runLifecycle runs the lifecycle scenario of strategy on b and appends it
// to the report.
func (d *demo) runLifecycle(ctx context.Context, b backend, strategy string) {
	p := d.p
	d.progress.begin("%s · %s: orders that come back: the burst with HOLD_TTL=%s and PER_USER_LIMIT=1 and without them, then %d units with holds of %s",
		b.Name, strategy, p.LifecycleBurstHold, p.LifecycleStock, p.LifecycleHoldTTL)
	l := &report.Lifecycle{
		Backend: b.Name, Strategy: strategy, Instances: p.Instances,
		HoldTTL: p.LifecycleHoldTTL, SweepEvery: p.LifecycleSweepEvery, PerUserLimit: 1,
		SKU:   trimSKU(fmt.Sprintf("lc-%s-%s-%s", d.runID, b.Name[:2], strategy)),
		Stock: int64(p.LifecycleStock), Buyers: p.LifecycleBuyers, VUs: min(p.LifecycleVUs, p.LifecycleBuyers), RunFor: p.LifecycleDuration,
		PayPercent: p.LifecyclePayPercent, CancelPercent: p.LifecycleCancelPct, TwicePercent: p.LifecycleTwicePercent, RetryPauseMs: lifecycleRetryPauseMs,
		Dir: filepath.ToSlash(filepath.Join("runs", b.Name+"-"+strategy, "lifecycle")),
	}
	d.rep.LifecycleRuns = append(d.rep.LifecycleRuns, l)
	began := time.Now()
	defer func() { l.Wall = time.Since(began) }()
	runDir := filepath.Join(d.dir, filepath.FromSlash(l.Dir))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		l.Error = err.Error()
		return
	}

	// 1. The burst with the lifecycle on, then the same burst without it,
	// right after and on fresh instances too: the strategy's burst in the
	// main table ran minutes earlier, and a burst of a few hundred units
	// lasts well under a second, while the machine's speed moves more than
	// that between the two. LIFECYCLE_BURST_ROUNDS repeats the pair, for a
	// median of each side; a burst sized up to last BURST_MIN_SECONDS
	// (batched, redis-reserve) runs once: it is steadier, and three pairs
	// of it would cost minutes.
	var on, off []*report.LifecycleBurst
	pairs := max(1, p.LifecycleBurstRounds)
	if d.burstStock(strategy) > int64(p.BurstStock) {
		pairs = 1
	}
	for round := 1; round <= pairs; round++ {
		suffix := ""
		if pairs > 1 {
			suffix = fmt.Sprintf("-%d", round)
		}
		onDir, offDir := "burst"+suffix, "burst-off"+suffix
		for _, dir := range []string{onDir, offDir} {
			if err := os.MkdirAll(filepath.Join(runDir, dir), 0o755); err != nil {
				l.Error = err.Error()
				return
			}
		}
		f, err := startFleet(ctx, p.StockBin, p.Instances, d.lifecycleEnv(b, strategy, p.LifecycleBurstHold), filepath.Join(runDir, onDir))
		if err != nil {
			if line, ok := refusal(err); ok && round == 1 {
				l.Unsupported = line
				d.progress.note("not yet supported: %s", line)
				return
			}
			l.Error = "instances did not start: " + err.Error()
			d.progress.note("%s", l.Error)
			return
		}
		on = append(on, d.runLifecycleBurst(ctx, f, b, strategy, l.Dir+"/"+onDir, "lcb"+suffix, p.LifecycleBurstHold))
		d.stopFleet(f, b.Name+"-"+strategy+" lifecycle burst")
		if ctx.Err() != nil {
			l.Error = "interrupted"
			return
		}
		if f, err = startFleet(ctx, p.StockBin, p.Instances, d.serviceEnv(b, strategy), filepath.Join(runDir, offDir)); err != nil {
			off = append(off, &report.LifecycleBurst{Error: "instances did not start: " + err.Error()})
		} else {
			off = append(off, d.runLifecycleBurst(ctx, f, b, strategy, l.Dir+"/"+offDir, "lco"+suffix, 0))
			d.stopFleet(f, b.Name+"-"+strategy+" lifecycle burst without it")
		}
		if ctx.Err() != nil {
			l.Error = "interrupted"
			return
		}
	}
	l.SetBursts(on, off)
	d.runLifecycleGoShape(ctx, b, strategy, l, runDir)
	if ctx.Err() != nil {
		l.Error = "interrupted"
		return
	}

	// 2. The sale whose orders come back.
	saleDir := filepath.Join(runDir, "sale")
	if err := os.MkdirAll(saleDir, 0o755); err != nil {
		l.Error = err.Error()
		return
	}
	f, err := startFleet(ctx, p.StockBin, p.Instances, d.lifecycleEnv(b, strategy, p.LifecycleHoldTTL), saleDir)
	if err != nil {
		l.Error = "instances did not start: " + err.Error()
		d.progress.note("%s", l.Error)
		return
	}
	defer d.stopFleet(f, b.Name+"-"+strategy+" lifecycle sale")
	d.runLifecycleSale(ctx, f, b, l, saleDir)
}

// lifecycleRetryPauseMs is how long a buyer told sold_out waits before
// clicking again: a person's pace, which also keeps the sold-out retries
// from taking the machine's cores from the orders being measured.
const lifecycleRetryPauseMs = 250

func trimSKU(sku string) string { return sku[:min(len(sku), 64)] }

// stopFleet stops f, noting in the report when that went wrong.
func (d *demo) stopFleet(f *fleet, name string) {
	if err := f.stop(); err != nil {
		d.progress.note("stopping the instances: %v", err)
		d.rep.Notes = append(d.rep.Notes, fmt.Sprintf("%s: stopping the instances: %v", name, err))
	}
}

// runLifecycleBurst runs the strategy's burst (same units, buyers and VUs)
// on f, whose instances take holds of hold (0: none), through runScenario,
// on a SKU named from prefix, and returns its figures.
func (d *demo) runLifecycleBurst(ctx context.Context, f *fleet, b backend, strategy, dir, prefix string, hold time.Duration) *report.LifecycleBurst {
	run := &report.Run{
		Backend: b.Name, Strategy: strategy, Scenario: report.Burst, Round: 1,
		SKU:       trimSKU(fmt.Sprintf("%s-%s-%s-%s", prefix, d.runID, b.Name[:2], strategy)),
		Instances: d.p.Instances, Dir: dir,
		Stock: d.burstStock(strategy), VUs: d.p.BurstVUs,
	}
	run.Buyers = int(float64(run.Stock)*d.p.buyersPerUnit() + 0.5)
	d.skus[b.Name] = append(d.skus[b.Name], run.SKU)
	d.runScenario(ctx, f, run)
	st := run.Stats()
	lb := &report.LifecycleBurst{
		SKU: run.SKU, Stock: run.Stock, Buyers: run.Buyers, VUs: run.VUs, HoldTTL: hold,
		Orders: st.Orders, SoldOut: st.SoldOut, Busy: st.Busy, Errors: st.Errors,
		OrdersPerSec: st.OrdersPerSec, P99: st.P99, ExitCode: run.ExitCode, Audit: run.Audit,
		Dir: run.Dir, Dashboard: run.Dashboard, Command: run.Command, Error: run.Error,
	}
	if run.Error == "" && run.Summary == nil {
		lb.Error = "no k6 summary"
	}
	what := "with the lifecycle on"
	if hold == 0 {
		what = "without it"
	} else {
		d.dropHolds(ctx, f, run.SKU)
	}
	d.progress.note("burst %s: %d orders, %.0f orders/s, p99 %s", what, lb.Orders, lb.OrdersPerSec, lb.P99.Round(time.Millisecond))
	return lb
}

// runLifecycleSale runs loadtest/lifecycle.js on f, then reads the audit
// once no hold is left and the sale's order rows.
func (d *demo) runLifecycleSale(ctx context.Context, f *fleet, b backend, l *report.Lifecycle, dir string) {
	d.skus[b.Name] = append(d.skus[b.Name], l.SKU)
	res := d.k6.run(ctx, k6Job{
		Label:  fmt.Sprintf("%s · %s · lifecycle", b.Name, l.Strategy),
		Script: "lifecycle.js",
		Vars: [][2]string{
			{"BASE_URLS", strings.Join(f.urls(), ",")},
			{"ADMIN_TOKEN", d.p.AdminToken},
			{"SKU", l.SKU},
			{"STOCK", strconv.FormatInt(l.Stock, 10)},
			{"BUYERS", strconv.Itoa(l.Buyers)},
			{"VUS", strconv.Itoa(l.VUs)},
			{"RUN_SECONDS", strconv.Itoa(int(l.RunFor.Seconds()))},
			{"PAY_PERCENT", strconv.Itoa(l.PayPercent)},
			{"CANCEL_PERCENT", strconv.Itoa(l.CancelPercent)},
			{"TWICE_PERCENT", strconv.Itoa(l.TwicePercent)},
			{"RETRY_PAUSE_MS", strconv.Itoa(l.RetryPauseMs)},
			{"STRATEGY", l.Strategy},
			{"BACKEND", l.Backend},
		},
		Dir:       dir,
		Dashboard: true,
		Planned:   l.RunFor,
	})
	l.Command = instancesCommand(f) + "\n" + res.Command
	if _, err := os.Stat(filepath.Join(dir, "dashboard.html")); err == nil {
		l.Dashboard = l.Dir + "/sale/dashboard.html"
	}
	l.ExitCode = res.ExitCode
	var errs []error
	if res.Err != nil {
		errs = append(errs, res.Err)
	}
	if s := res.Summary; s != nil {
		l.Orders, l.SoldOut, l.LimitReached, l.Busy, l.Errors = s.Count("orders"), s.Count("sold_out"), s.Count("limit_reached"), s.Count("busy"), s.Count("errors")
		l.SecondOrders, l.LimitBreached = s.Count("second_orders"), s.Count("limit_breached")
		l.Paid, l.PayRefused, l.Cancelled, l.CancelRefused = s.Count("paid"), s.Count("pay_refused"), s.Count("cancelled"), s.Count("cancel_refused")
		l.Abandoned, l.GaveUp = s.Count("abandoned"), s.Count("gave_up")
		if v, ok := s.Value("paid_at", "max"); ok {
			l.LastPaid = time.Duration(v * float64(time.Millisecond))
		}
	}
	if err := f.dead(); err != nil {
		errs = append(errs, fmt.Errorf("an instance died during the run: %w", err))
	}
	// The holds left to lapse at the end come back within a hold and a
	// sweep: the audit is read once none is left, so that every return
	// is counted.
	audit, err := d.auditWithoutHolds(ctx, f, l.SKU, l.HoldTTL+l.SweepEvery+5*time.Second)
	if err != nil {
		errs = append(errs, err)
	}
	l.Audit = audit
	// stock_orders_settled_total{state} among them, for a reader who
	// wants to check the audit's counts against the instances'.
	l.Metrics = scrapeMetrics(ctx, f, dir, l.Dir+"/sale")
	rows, over, err := orderTimes(ctx, b.URL, l.SKU)
	if err != nil {
		errs = append(errs, fmt.Errorf("reading the order rows: %w", err))
	} else {
		l.Resale, l.OverLimit = report.ResaleOf(rows), over
	}
	if err := errors.Join(errs...); err != nil {
		l.Error = err.Error()
	}
	v := l.Judge()
	if a := l.Audit; a != nil {
		d.progress.note("lifecycle: %d of %d units paid (last at %.1fs), %d returned (%d cancelled, %d expired), %d resold; %d limit refusals of %d double clicks; consistent %v → %s %s",
			a.Paid, a.Initial+a.Restocked, l.LastPaid.Seconds(), a.Returned, a.Cancelled, a.Expired, l.Resold(), l.LimitReached, l.SecondOrders, a.Consistent,
			report.StatusText(v), strings.Join(v.Problems, "; "))
	}
	if r := l.Resale; r != nil {
		d.progress.note("expiry → resale p50 %s (max %s) over %d units, of which the sweep p50 %s; cancel → resale p50 %s",
			r.ExpiryP50.Round(time.Millisecond), r.ExpiryMax.Round(time.Millisecond), r.Expired, r.SweepP50.Round(time.Millisecond), r.CancelP50.Round(time.Millisecond))
	}
}

// auditWithoutHolds polls the audit until no hold is left or wait passes,
// and returns the last audit read.
func (d *demo) auditWithoutHolds(ctx context.Context, f *fleet, sku string, wait time.Duration) (*report.Audit, error) {
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		a, err := fetchAudit(ctx, f, d.p.AdminToken, sku)
		if err != nil || a.Held == 0 || time.Now().After(deadline) {
			return a, err
		}
		select {
		case <-ctx.Done():
			return a, nil
		case <-tick.C:
		}
	}
}

// orderTimes reads a sale's order rows (their state and times, on the
// database's clock) and counts the buyers holding or having paid more than
// one unit of it.
func orderTimes(ctx context.Context, databaseURL, sku string) ([]report.OrderTimes, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	const overLimit = `SELECT count(*) FROM (SELECT user_id FROM orders WHERE sku = %s AND state IN ('held', 'paid')
		GROUP BY user_id HAVING sum(quantity) > 1) t`
	if strings.HasPrefix(databaseURL, "mysql://") {
		return mysqlOrderTimes(ctx, databaseURL, sku, fmt.Sprintf(overLimit, "?"))
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT state, created_at, expires_at, settled_at FROM orders WHERE sku = $1`, sku)
	if err != nil {
		return nil, 0, err
	}
	var out []report.OrderTimes
	for rows.Next() {
		var o report.OrderTimes
		var expires, settled *time.Time
		if err := rows.Scan(&o.State, &o.Created, &expires, &settled); err != nil {
			rows.Close()
			return nil, 0, err
		}
		if expires != nil {
			o.Expires = *expires
		}
		if settled != nil {
			o.Settled = *settled
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var over int64
	if err := conn.QueryRow(ctx, fmt.Sprintf(overLimit, "$1"), sku).Scan(&over); err != nil {
		return nil, 0, err
	}
	return out, over, nil
}

// mysqlOrderTimes is orderTimes on MariaDB/MySQL. created_at is a
// TIMESTAMP, read through UNIX_TIMESTAMP so that the session's time zone
// does not shift it; expires_at and settled_at are DATETIMEs in UTC
// (UTC_TIMESTAMP), which the driver reads as UTC.
func mysqlOrderTimes(ctx context.Context, databaseURL, sku, overLimit string) ([]report.OrderTimes, int64, error) {
	cfg, err := dburl.MySQL(databaseURL)
	if err != nil {
		return nil, 0, err
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, 0, err
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT state, CAST(UNIX_TIMESTAMP(created_at) * 1000000 AS SIGNED), expires_at, settled_at FROM orders WHERE sku = ?`, sku)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []report.OrderTimes
	for rows.Next() {
		var o report.OrderTimes
		var created int64
		var expires, settled sql.NullTime
		if err := rows.Scan(&o.State, &created, &expires, &settled); err != nil {
			return nil, 0, err
		}
		o.Created = time.UnixMicro(created).UTC()
		o.Expires, o.Settled = expires.Time, settled.Time
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	var over int64
	if err := db.QueryRowContext(ctx, overLimit, sku).Scan(&over); err != nil {
		return nil, 0, err
	}
	return out, over, nil
}
