package faults

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/flashsale/stock/internal/strategies"
)

// All runs the scenarios that want (nil: all fourteen), in order, and returns
// one result per run. Scenario 5 runs on e.Postgres and e.MariaDB.
// Scenario 7 is the coordination services': etcd-lock and zk-lock with
// their cluster's leader killed, and their paused holder. Scenario 8 is the
// Redis reservation's: its Redis restarted with its AOF, and without its
// data (fails closed), the database down while Redis sells. Scenario 9
// runs the Redis restart and wipe, the database crash (on e.Postgres) and
// an instance kill with a catalog of 10,000 SKUs on sale; scenario 10 is
// the restart table (RestartTable) for 200, 2,000 and 10,000 SKUs.
func (e *Env) All(ctx context.Context, want func(scenario int) bool) []Result {
	var results []Result
	for _, s := range e.steps(ctx) {
		if ctx.Err() != nil {
			break
		}
		if want == nil || want(s.scenario) {
			results = append(results, s.run())
		}
	}
	return results
}

// step is one run of the suite: its scenario, the strategy it puts
// through the fault, and what runs it.
type step struct {
	scenario int
	strategy string
	run      func() Result
}

// steps lists the suite's runs in order, without running them. Every
// safe strategy of the registry is in a kill -9 run at least
// (TestEverySafeStrategyFacesTheFaults).
func (e *Env) steps(ctx context.Context) []step {
	// Every safe strategy is killed mid-load (scenario 1), but for the
	// Redis locks, which face the loss of their servers and a paused
	// holder instead (scenarios 2-4): those that only deduct alternate the
	// engines; batched, whose group commit runs its own SQL, runs on both;
	// a lock table runs on MariaDB (its paused holder runs on PostgreSQL);
	// the others of a family alternate from PostgreSQL.
	var steps []step
	engines := []string{"mysql", "postgres"}
	for _, s := range strategies.All() {
		if s.New != nil && s.Safe() {
			engine := engines[len(steps)%2]
			steps = append(steps, step{1, s.Name, func() Result { return e.KillRestart(ctx, engine, s.Name) }})
		}
	}
	inFamily := map[strategies.Family]int{}
	for _, s := range strategies.All() {
		if s.New != nil || !s.Safe() || s.Lock == strategies.LockRedis || s.Lock == strategies.LockRedlock {
			continue
		}
		var kill []string
		switch {
		case s.Family == strategies.FamilyBatched:
			kill = []string{"postgres", "mysql"}
		case s.Lock == strategies.LockTable:
			kill = []string{"mysql"}
		default:
			kill = []string{engines[(inFamily[s.Family]+1)%2]}
			inFamily[s.Family]++
		}
		for _, engine := range kill {
			steps = append(steps, step{1, s.Name, func() Result { return e.KillRestart(ctx, engine, s.Name) }})
		}
	}
	// Every lock strategy's holder is paused past its lock (scenario 2;
	// 7 for a lock on a consensus service, with its leader killed too),
	// fenced and, to show what fencing prevents, not; a control has no
	// fencing to turn on.
	var coordination []step
	for _, s := range strategies.All() {
		if s.Family != strategies.FamilyLock {
			continue
		}
		scenario := 2
		if consensus(s.Lock) {
			scenario = 7
			coordination = append(coordination, step{7, s.Name, func() Result { return e.CoordinatorLeaderKill(ctx, s.Name) }})
		}
		fencing := []string{"on", "off"}
		if !s.Safe() {
			fencing = []string{"off"}
		}
		for _, f := range fencing {
			st := step{scenario, s.Name, func() Result { return e.PausedHolder(ctx, s.Name, f) }}
			if scenario == 7 {
				coordination = append(coordination, st)
			} else {
				steps = append(steps, st)
			}
		}
	}
	steps = append(steps, []step{
		{3, strategies.NameRedlock, func() Result { return e.RedlockNodeLoss(ctx) }},
		{3, strategies.NameRedlock, func() Result { return e.RedlockDownRate(ctx) }},
		{4, strategies.NameRedisLock, func() Result { return e.RedisRestart(ctx) }},
		{5, strategies.NameConditional, func() Result { return e.DatabaseRestart(ctx, e.Postgres) }},
		{5, strategies.NameConditional, func() Result { return e.DatabaseRestart(ctx, e.MariaDB) }},
		{6, strategies.NameConditional, func() Result { return e.IdempotentRetries(ctx) }},
	}...)
	steps = append(steps, coordination...)
	steps = append(steps, []step{
		{8, strategies.NameRedisReserve, func() Result { return e.ReserveRedisRestart(ctx, strategies.NameRedisReserve) }},
		{8, strategies.NameRedisWatch, func() Result { return e.ReserveRedisRestart(ctx, strategies.NameRedisWatch) }},
		{8, strategies.NameRedisReserve, func() Result { return e.ReserveRedisWiped(ctx) }},
		{8, strategies.NameRedisReserve, func() Result { return e.ReserveDatabaseDown(ctx, e.Postgres, strategies.NameRedisReserve) }},
		{8, strategies.NameRedisReserve, func() Result { return e.ReserveDatabaseDown(ctx, e.MariaDB, strategies.NameRedisReserve) }},
	}...)
	for _, s := range strategies.ReservedNames {
		steps = append(steps, step{9, s, func() Result { return e.CatalogRedisRestart(ctx, s) }})
	}
	for _, s := range strategies.ReservedNames {
		steps = append(steps, step{9, s, func() Result { return e.CatalogRedisWiped(ctx, s) }})
	}
	for _, s := range CatalogStrategies {
		steps = append(steps, step{9, s, func() Result { return e.CatalogDatabaseKill(ctx, e.Postgres, s) }})
	}
	for _, s := range CatalogStrategies {
		steps = append(steps, step{9, s, func() Result { return e.CatalogInstanceKill(ctx, "postgres", s) }})
	}
	// Orders that come back: the sweeping instance killed mid-sweep, and
	// the database crashed mid-sweep, on both engines.
	for _, fault := range []string{LifecycleSweeperKill, LifecycleDatabaseCrash} {
		steps = append(steps,
			step{11, strategies.NameConditional, func() Result { return e.LifecycleFault(ctx, "postgres", e.Postgres, fault) }},
			step{11, strategies.NameConditional, func() Result { return e.LifecycleFault(ctx, "mysql", e.MariaDB, fault) }})
	}
	// Orders that come back on the reservation strategies: their Redis
	// killed while returns are relayed to it, on both engines.
	for _, s := range strategies.ReservedNames {
		steps = append(steps,
			step{12, s, func() Result { return e.LifecycleRedisKill(ctx, "postgres", e.Postgres, s) }},
			step{12, s, func() Result { return e.LifecycleRedisKill(ctx, "mysql", e.MariaDB, s) }})
	}
	// The sold-out mark across instances while units come back, one
	// instance frozen past its bound; and the control, whose marks outlive
	// the bound the check assumes, which the check must catch.
	steps = append(steps,
		step{13, strategies.NameConditional, func() Result { return e.SoldOutMark(ctx, "postgres", strategies.NameConditional, false) }},
		step{13, strategies.NameConditional, func() Result { return e.SoldOutMark(ctx, "postgres", strategies.NameConditional, true) }},
		step{13, strategies.NameConditional, func() Result { return e.SoldOutMark(ctx, "mysql", strategies.NameConditional, false) }},
		step{13, strategies.NameBatched, func() Result { return e.SoldOutMark(ctx, "postgres", strategies.NameBatched, false) }},
		step{13, strategies.NameBatched, func() Result { return e.SoldOutMark(ctx, "mysql", strategies.NameBatched, false) }})
	// The reservation's Redis replicated under Sentinel, its primary lost
	// while the replicas lag; and the control without WAIT, which must be
	// caught losing orders answered 201. Then redis-lock's lock handed
	// over by such a failover while its holder is frozen, fenced and (the
	// control, which must oversell) not.
	for _, s := range strategies.ReservedNames {
		steps = append(steps, step{14, s, func() Result { return e.RedisFailover(ctx, s, false) }})
	}
	steps = append(steps,
		step{14, strategies.NameRedisReserve, func() Result { return e.RedisFailover(ctx, strategies.NameRedisReserve, true) }},
		step{14, strategies.NameRedisLock, func() Result { return e.LockFailover(ctx, "on") }},
		step{14, strategies.NameRedisLock, func() Result { return e.LockFailover(ctx, "off") }})
	// The replicated databases: PostgreSQL's primary under Patroni killed,
	// and frozen past the leader's ttl; the control on asynchronous
	// replication, which must be caught losing orders answered 201; one
	// Galera node killed and restarted.
	for _, s := range []string{strategies.NameConditional, strategies.NameBatched, strategies.NameDBLock} {
		steps = append(steps, step{15, s, func() Result { return e.PatroniFailover(ctx, s, PrimaryKilled) }})
	}
	steps = append(steps,
		step{15, strategies.NameConditional, func() Result { return e.PatroniFailover(ctx, strategies.NameConditional, PrimaryFrozen) }},
		step{15, strategies.NameConditional, func() Result { return e.PatroniFailover(ctx, strategies.NameConditional, AsyncLagging) }})
	for _, s := range []string{strategies.NameConditional, strategies.NameBatched, strategies.NameDBLock} {
		steps = append(steps, step{16, s, func() Result { return e.GaleraNodeKill(ctx, s) }})
	}
	sizes := RestartTableSizes
	if e.Short {
		sizes = sizes[:2]
	}
	for _, s := range strategies.ReservedNames {
		for _, n := range sizes {
			steps = append(steps, step{10, s, func() Result { return e.RestartTable(ctx, s, n) }})
		}
	}
	return steps
}

// consensus reports whether a lock lives on a consensus service, whose
// leader the suite kills (scenario 7).
func consensus(kind strategies.LockKind) bool {
	return kind == strategies.LockEtcd || kind == strategies.LockZooKeeper
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
		"have taken effect). Verdicts: **ok**; **expected-oversell** (an unsafe configuration, FENCING=off or a control, oversold or lost orders as it may); " +
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
	writeCatalogSummary(p, rep.Runs)
	writeRestartTable(p, rep.Runs)
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
	if cat := r.Catalog; cat != nil && c.StockPerSKU == 0 {
		cfg += fmt.Sprintf(" from %d workers, client timeout %s, %d SKUs of %d to %d units (by their share of the load)",
			c.Workers, c.ClientTimeout, c.SKUs, cat.MinStock, cat.MaxStock)
	} else {
		cfg += fmt.Sprintf(" from %d workers, client timeout %s, %d SKUs of %d units",
			c.Workers, c.ClientTimeout, c.SKUs, c.StockPerSKU)
	}
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
	if r.Catalog != nil {
		writeCatalog(p, r.Catalog)
	}
	if lf := r.Lifecycle; lf != nil && r.Relay != nil {
		writeRelay(p, lf, r.Relay)
	} else if lf != nil && r.Scenario == 13 {
		writeSoldOut(p, lf)
	} else if lf != nil {
		writeLifecycle(p, lf)
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

// writeCatalogSummary writes one line per catalog run (scenario 9): the
// load after the fault and the audit of every SKU.
func writeCatalogSummary(p func(string, ...any), runs []Result) {
	first := true
	for _, r := range runs {
		c := r.Catalog
		if r.Scenario != 9 || c == nil || c.AfterFault == nil {
			continue
		}
		if first {
			p("### With a catalog on sale\n\n")
			p("| run | SKUs | set-up | after the fault: from | first 201 | 201/s (before the fault) | 409 | 503 | SKUs ordered: their first order's answer, median / slowest | over 1 s | refused | exact / audited | worst SKU |\n")
			p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			first = false
		}
		a := c.AfterFault
		p("| `%s` | %d | %.1fs | %s | %s | %.1f (%.1f) | %d | %d | %d: %.3fs / %.3fs (`%s`) | %d | %d | %d / %d | %s |\n",
			r.Name, c.SKUs, c.SetupSeconds, a.What, orNever(a.FirstCreatedS), a.CreatedPerSecond, a.CreatedPerSecondBefore,
			a.SoldOut, a.Responses503, a.SKUsOrdered, a.MedianFirstAnswerS, a.SlowestFirstAnswerS, a.SlowestSKU, a.SKUsOverASecond,
			a.SKUsFirstRefused, c.Exact, c.Audited, skuLine(c.Worst))
	}
	if !first {
		p("\n")
	}
}

// writeRestartTable writes the restart table (scenario 10).
func writeRestartTable(p func(string, ...any), runs []Result) {
	first := true
	for _, r := range runs {
		t := r.Restart
		if t == nil {
			continue
		}
		if first {
			p("### The restart table\n\n")
			p("One instance, a durable Redis (appendonly yes, appendfsync always), N SKUs on sale; one order answered 201, the Redis killed " +
				"(kill -9) and started again from its append-only file, then one order every 0.3 s for the SKU ordered before; then 10 " +
				"orders of other SKUs of the catalog. Before each SKU was checked on its own as it is ordered, a user measured a first 201 " +
				"0.53 s after the restart with 200 SKUs, 2.73 s with 1,000, and 503s for 30 s with 2,000, 40 s with 5,000 and 60 s with 10,000.\n\n")
			p("| strategy | SKUs | verdict | set-up | AOF | Redis answers after | first 201 after the restart (after Redis answers) | 503s before it | other SKUs: answered at their first order, slowest | checks after the restart (sales, more than once) | audit |\n")
			p("|---|---|---|---|---|---|---|---|---|---|---|\n")
			first = false
		}
		audit := "-"
		if c := r.Catalog; c != nil && c.Audited > 0 {
			audit = fmt.Sprintf("%d / %d exact", c.Exact, c.Audited)
		}
		checks := "-"
		if c := r.Catalog; c != nil {
			checks = fmt.Sprintf("%d, %d", c.SalesChecked, c.SalesCheckedAgain)
		}
		p("| %s | %d | **%s** | %.1fs | %d kB | %.2fs | %s (%s) | %d | %d of %d, %.3fs | %s | %s |\n", t.Strategy, t.SKUs, r.Verdict, t.SetupSeconds,
			t.AOFBytes/1024, t.ReadyS, orNever(t.FirstCreatedS), orNever(t.FirstCreatedAfterReadyS), t.Refused503, t.OtherAnswered, t.OtherSKUs,
			t.OtherSlowestS, checks, audit)
	}
	if !first {
		p("\n")
	}
}

// writeCatalog writes a catalog run's own figures.
func writeCatalog(p func(string, ...any), c *CatalogFigures) {
	p("Catalog: %d SKUs put on sale in %.1fs (%d at a time, %.0f sales/s", c.SKUs, c.SetupSeconds, c.SetupWorkers, c.SetupPerSecond)
	if c.SetupRetries > 0 {
		p(", %d PUTs retried", c.SetupRetries)
	}
	p(")")
	if c.Skew > 0 {
		p("; orders drawn from a Zipf-like distribution (exponent %.1f): the 10 hottest SKUs took %.0f%% of them", c.Skew, 100*c.Hot10Share)
	}
	p("; %d SKUs ordered, %d sold.", c.SKUsOrdered, c.SKUsSold)
	if c.Restarted > 0 {
		p(" After the loss of Redis's data, the sales of the %d hottest were started again in %.2fs.", c.Restarted, c.RestartedSeconds)
	}
	if c.SalesChecked > 0 {
		p(" After the restart %d sales were checked against the database, %d of them more than once (at most %d times).",
			c.SalesChecked, c.SalesCheckedAgain, c.MostChecks)
	}
	p("\n\n")
	if a := c.AfterFault; a != nil {
		p("After the fault (from %.2fs, %s): first 201 %s later; %d requests, %d 201 (%.1f/s; %.1f/s before the fault), %d 409, %d 503. "+
			"%d SKUs ordered: the first order of each answered 201 or 409 in %.3fs at the median, %.3fs at the slowest (`%s`), %d over a second; %d answered otherwise",
			a.FromS, a.What, orNever(a.FirstCreatedS), a.Requests, a.Created, a.CreatedPerSecond, a.CreatedPerSecondBefore, a.SoldOut,
			a.Responses503, a.SKUsOrdered, a.MedianFirstAnswerS, a.SlowestFirstAnswerS, a.SlowestSKU, a.SKUsOverASecond, a.SKUsFirstRefused)
		if a.RefusedSKU != "" {
			p(" (e.g. `%s`: %s)", a.RefusedSKU, a.RefusedAnswer)
		}
		p(".\n\n")
	}
	p("Audit of every SKU: %d of %d sales exact (the audit adds up, nothing oversold, the rows hold what the audit says, every 201 a row, "+
		"no phantom or duplicate row). Worst: %s. Hottest: %s. The table below holds the SKUs that are not exact (up to 50) and the 10 hottest.\n\n",
		c.Exact, c.Audited, skuLine(c.Worst), skuLine(c.Hottest))
}

// skuLine describes one sale's figures in a line.
func skuLine(f *SKUFigures) string {
	if f == nil {
		return "-"
	}
	s := fmt.Sprintf("`%s` initial %d, available %d, ordered %d, rows %d (%d units), 201s %d, oversold %d, lost %d, phantom %d, duplicate %d",
		f.SKU, f.Initial, f.Available, f.Ordered, f.Rows, f.RowUnits, f.Created, f.Oversold, f.Lost, f.Phantom, f.Duplicate)
	if f.LostWithRedis > 0 {
		s += fmt.Sprintf(", lost with Redis's data %d", f.LostWithRedis)
	}
	if f.Exact {
		return s + " (exact)"
	}
	return s + " (**not exact**)"
}

// writeLifecycle writes what a run of scenario 11 did and found.
func writeLifecycle(p func(string, ...any), lf *LifecycleFigures) {
	p("HOLD_TTL=%s, PER_USER_LIMIT=1. Orders %d: 201 %d, sold out %d, limit reached %d. Pays %d: paid %d, expired %d. "+
		"Cancels %d: cancelled %d, expired %d. Reads %d. Unknown outcomes %d, 503s %d, refused %d.\n\n",
		lf.HoldTTL, lf.Orders, lf.Created, lf.SoldOut, lf.LimitReached, lf.Pays, lf.Paid, lf.PayExpired,
		lf.Cancels, lf.Cancelled, lf.CancelExpired, lf.Reads, lf.Unknown, lf.Responses503, lf.Refused)
	p("Sweep: %d abandoned holds in %d bursts; instance %d caught with its sweep transaction open (%d rows) after %d tries; "+
		"%d still held %.1fs after the load. Rows at the end: %d units on sale, %d available, %d paid, %d returned "+
		"(%d orders expired, %d cancelled). 201/s before the fault %.1f, after %.1f. Per-order check: %d orders, %d operations, "+
		"%d illegal, %d unknown.\n\n",
		lf.BurstHolds, lf.Bursts, lf.CaughtIn, lf.CaughtRows, lf.CatchTries, lf.HeldAtDrain, lf.DrainSeconds,
		lf.InitialUnits, lf.AvailableUnits, lf.PaidUnits, lf.ReturnedUnits, lf.ExpiredOrders, lf.CancelledOrders,
		lf.CreatedPerSecondBefore, lf.CreatedPerSecondAfter, lf.CheckedOrders, lf.CheckedOps, lf.IllegalOrders, lf.UnknownOrders)
}

// writeSoldOut writes what a run of scenario 13 did (its returns and the
// freeze are in its notes).
func writeSoldOut(p func(string, ...any), lf *LifecycleFigures) {
	p("HOLD_TTL=%s (no hold lapses in the run), PER_USER_LIMIT=1, one buyer per order. Orders %d: 201 %d, sold out %d, limit reached %d. "+
		"Cancels %d: cancelled %d. Unknown outcomes %d, 503s %d, refused %d. Rows at the end: %d units on sale (initial and restocked), "+
		"%d available, %d returned (%d orders cancelled). Per-order check: %d orders, %d operations, %d illegal, %d unknown.\n\n",
		lf.HoldTTL, lf.Orders, lf.Created, lf.SoldOut, lf.LimitReached, lf.Cancels, lf.Cancelled, lf.Unknown, lf.Responses503, lf.Refused,
		lf.InitialUnits, lf.AvailableUnits, lf.ReturnedUnits, lf.CancelledOrders, lf.CheckedOrders, lf.CheckedOps, lf.IllegalOrders, lf.UnknownOrders)
}
