package faults

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/flashsale/stock/internal/inventory"
)

// All runs the scenarios that want (nil: all eight), in order, and returns
// one result per run. Scenario 5 runs on e.Postgres and e.MariaDB.
// Scenario 7 is the coordination services': etcd-lock and zk-lock with
// their cluster's leader killed, and their paused holder. Scenario 8 is the
// Redis reservation's: its Redis restarted with its AOF, and without its
// data (fails closed), the database down while Redis sells.
func (e *Env) All(ctx context.Context, want func(scenario int) bool) []Result {
	steps := []struct {
		scenario int
		run      func() Result
	}{
		{1, func() Result { return e.KillRestart(ctx, "postgres", inventory.NameConditional) }},
		{1, func() Result { return e.KillRestart(ctx, "mysql", inventory.NameForUpdate) }},
		{1, func() Result { return e.KillRestart(ctx, "postgres", inventory.NameBatched) }},
		{1, func() Result { return e.KillRestart(ctx, "mysql", inventory.NameBatched) }},
		{1, func() Result { return e.KillRestart(ctx, "postgres", inventory.NameEtcdLock) }},
		{1, func() Result { return e.KillRestart(ctx, "mysql", inventory.NameZKLock) }},
		{1, func() Result { return e.KillRestart(ctx, "mysql", inventory.NameDBLock) }},
		{1, func() Result { return e.KillRestart(ctx, "postgres", inventory.NameRedisReserve) }},
		{1, func() Result { return e.KillRestart(ctx, "mysql", inventory.NameRedisWatch) }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameRedisLock, "on") }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameRedisLock, "off") }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameRedlock, "on") }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameRedlock, "off") }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameDBLock, "on") }},
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameDBLock, "off") }},
		// The seeds' SETNX + GETSET lock has no fencing to turn on: its
		// paused holder wakes, writes, and deletes its successor's lock.
		{2, func() Result { return e.PausedHolder(ctx, inventory.NameLegacyGetset, "off") }},
		{3, func() Result { return e.RedlockNodeLoss(ctx) }},
		{3, func() Result { return e.RedlockDownRate(ctx) }},
		{4, func() Result { return e.RedisRestart(ctx) }},
		{5, func() Result { return e.DatabaseRestart(ctx, e.Postgres) }},
		{5, func() Result { return e.DatabaseRestart(ctx, e.MariaDB) }},
		{6, func() Result { return e.IdempotentRetries(ctx) }},
		{7, func() Result { return e.CoordinatorLeaderKill(ctx, inventory.NameEtcdLock) }},
		{7, func() Result { return e.PausedHolder(ctx, inventory.NameEtcdLock, "on") }},
		{7, func() Result { return e.PausedHolder(ctx, inventory.NameEtcdLock, "off") }},
		{7, func() Result { return e.CoordinatorLeaderKill(ctx, inventory.NameZKLock) }},
		{7, func() Result { return e.PausedHolder(ctx, inventory.NameZKLock, "on") }},
		{7, func() Result { return e.PausedHolder(ctx, inventory.NameZKLock, "off") }},
		{8, func() Result { return e.ReserveRedisRestart(ctx, inventory.NameRedisReserve) }},
		{8, func() Result { return e.ReserveRedisRestart(ctx, inventory.NameRedisWatch) }},
		{8, func() Result { return e.ReserveRedisWiped(ctx) }},
		{8, func() Result { return e.ReserveDatabaseDown(ctx, e.Postgres, inventory.NameRedisReserve) }},
		{8, func() Result { return e.ReserveDatabaseDown(ctx, e.MariaDB, inventory.NameRedisReserve) }},
	}
	var results []Result
	for _, s := range steps {
		if ctx.Err() != nil {
			break
		}
		if want == nil || want(s.scenario) {
			results = append(results, s.run())
		}
	}
	return results
}

// SuiteVerdict is failed when a run failed or could not be carried out.
func SuiteVerdict(results []Result) Verdict {
	for _, r := range results {
		if r.Verdict == VerdictFailed || r.Verdict == VerdictError {
			return VerdictFailed
		}
	}
	return VerdictOK
}

// WriteMarkdown writes the faults section of the report.
func WriteMarkdown(w io.Writer, rep Report) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("## Faults\n\n")
	p("Each run starts three instances of the service on 127.0.0.1 under a bounded Go load (an open model: orders arrive at a fixed rate, " +
		"quantities 1-3), injects its fault, and then checks the audit of every SKU, the order rows against every answer a client saw, " +
		"and each SKU's history for linearizability against a stock counter (porcupine; an answer the client never got may or may not " +
		"have taken effect). Verdicts: **ok**; **expected-oversell** (an unsafe configuration, FENCING=off, oversold as it may); " +
		"**degraded** (nothing oversold or lost, but availability fell short of the scenario's expectation); **failed** (a safe " +
		"configuration oversold, lost or invented an order, or is not linearizable); **error**/**skipped** (the run could not be carried out).\n\n")
	p("Suite verdict: **%s** (%s, %d runs, started %s, %.0fs).\n\n", rep.Verdict, map[bool]string{true: "short form", false: "full form"}[rep.Short],
		len(rep.Runs), rep.Started.Format("2006-01-02 15:04:05 MST"), rep.Finished.Sub(rep.Started).Seconds())

	p("| # | run | verdict | requests | orders | 201 | 503 | unknown | oversold | lost | recovery | linearizable |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Runs {
		f := r.Figures
		rec := "-"
		if f.RecoverySeconds != nil {
			rec = fmt.Sprintf("%.2fs", *f.RecoverySeconds)
		}
		p("| %d | `%s` | **%s** | %d | %d | %d | %d | %d | %d | %d | %s | %s |\n", r.Scenario, r.Name, r.Verdict,
			f.Requests, f.Orders, f.Created, f.Responses503, f.Unknown, f.OversoldUnits, f.LostOrders, rec, r.Linearizability.Result)
	}
	p("\n")
	for _, r := range rep.Runs {
		writeRun(p, r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeRun(p func(string, ...any), r Result) {
	c, f := r.Config, r.Figures
	p("### %d. %s — %s\n\n", r.Scenario, r.Name, r.Verdict)
	p("%s.\n\n", r.Title)
	cfg := fmt.Sprintf("%s, STRATEGY=%s, %d instances", c.Engine, c.Strategy, c.Instances)
	switch {
	case c.RedisServers > 0:
		cfg += fmt.Sprintf(", %d Redis servers", c.RedisServers)
	case c.EtcdMembers > 0:
		cfg += fmt.Sprintf(", %d etcd members", c.EtcdMembers)
	case c.ZKServers > 0:
		cfg += fmt.Sprintf(", %d ZooKeeper servers", c.ZKServers)
	}
	if c.Fencing != "" {
		cfg += fmt.Sprintf(", FENCING=%s, LOCK_TTL=%s", c.Fencing, c.LockTTL)
	}
	cfg += fmt.Sprintf(", ORDER_TIMEOUT=%s; ", c.OrderTimeout)
	if c.Rate > 0 {
		cfg += fmt.Sprintf("load %.0f orders/s for up to %.0fs", c.Rate, c.LoadSeconds)
	} else {
		// Burst runs send every buyer at once, not a steady rate.
		cfg += "bursts (every buyer at once)"
	}
	cfg += fmt.Sprintf(" from %d workers, client timeout %s, %d SKUs of %d units",
		c.Workers, c.ClientTimeout, c.SKUs, c.StockPerSKU)
	if c.Idempotency {
		cfg += ", Idempotency-Key on every order, retried on another instance until a definite answer"
	}
	if !c.Safe {
		cfg += " — **unsafe configuration**"
	}
	p("Configuration: %s.\n\n", cfg)
	if r.Error != "" {
		p("Could not be carried out: `%s`\n\n", firstLine(r.Error))
		return
	}
	if len(r.Events) > 0 {
		p("Faults:\n\n")
		for _, e := range r.Events {
			p("- %.2fs: %s\n", e.AtS, e.What)
		}
		p("\n")
	}
	p("| phase | requests | 201 | 409 | 503 busy | 503 unavailable | no answer | refused | unknown orders |\n|---|---|---|---|---|---|---|---|---|\n")
	row := func(name string, f Figures) {
		p("| %s | %d | %d | %d | %d | %d | %d | %d | %d |\n", name, f.Requests, f.Created, f.SoldOut, f.Busy, f.Unavailable, f.NoAnswer, f.Refused, f.Unknown)
	}
	for _, ph := range r.Phases {
		row(fmt.Sprintf("%s (%.1f-%.1fs)", ph.Name, ph.FromS, ph.ToS), ph.Figures)
	}
	row("**whole run**", f)
	p("\n")
	p("Order rows %d (%d units); oversold units %d; 201s without a row %d; rows nobody was told of (answer lost) %d",
		f.OrderRows, f.UnitsSold, f.OversoldUnits, f.LostOrders, f.UnseenOrders)
	if f.InFlightAtFault != nil {
		p(" (bound: %d requests in flight at the kill)", *f.InFlightAtFault)
	}
	p("; phantom rows %d; duplicate orders %d", f.PhantomOrders, f.DuplicateOrders)
	if f.RecoverySeconds != nil {
		p("; recovery %.2fs", *f.RecoverySeconds)
	}
	if f.FencedOffWrites != nil {
		p("; fenced-off writes %.0f, locks lost %.0f", *f.FencedOffWrites, *f.LocksLost)
	}
	if f.SlowestSeconds != nil {
		p("; slowest answer %.2fs", *f.SlowestSeconds)
	}
	if f.Dropped > 0 {
		p("; %d arrivals dropped (every worker busy)", f.Dropped)
	}
	l := r.Linearizability
	p(". Linearizability: **%s** (%d SKUs, %d operations, %.1fs).\n\n", l.Result, l.SKUs, l.Operations, l.Seconds)
	for _, n := range l.NotOK {
		p("- `%s`: %s %s", n.SKU, n.Result, n.Reason)
		if n.Visualization != "" {
			p(" — [porcupine's visualisation](%s)", n.Visualization)
		}
		p("\n")
	}
	if len(r.Rates) > 0 && r.Scenario == 7 {
		p("| window of the load | requests | 201 | orders/s | × before the kill | 503 | 503 share | unknown |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range r.Rates {
			p("| %s | %d | %d | %.1f | %.2f | %d | %.2f%% | %d |\n", c.Name, c.Buyers, c.Created,
				c.OrdersPerSecond, c.Ratio, c.Responses503, 100*c.Share503, c.Unknown)
		}
		p("\n")
	} else if len(r.Rates) > 0 {
		p("| case | buyers | 201 | orders/s (median round) | rounds | × all up | 503 | 503 share | unknown |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range r.Rates {
			p("| %s | %d | %d | %.1f | %v | %.2f | %d | %.2f%% | %d |\n", c.Name, c.Buyers, c.Created,
				c.OrdersPerSecond, c.RoundRates, c.Ratio, c.Responses503, 100*c.Share503, c.Unknown)
		}
		p("\n")
	}
	p("| sku | initial | available | ordered | orders | consistent |\n|---|---|---|---|---|---|\n")
	for _, a := range r.Audits {
		p("| %s | %d | %d | %d | %d | %t |\n", a.SKU, a.Initial, a.Available, a.Ordered, a.Orders, a.Consistent)
	}
	p("\n")
	for _, s := range r.Failures {
		p("- **%s:** %s\n", map[bool]string{true: "failure", false: "seen (unsafe configuration)"}[c.Safe], s)
	}
	for _, s := range r.Warnings {
		p("- **warning:** %s\n", s)
	}
	for _, s := range r.Notes {
		p("- %s\n", s)
	}
	p("\n")
}
