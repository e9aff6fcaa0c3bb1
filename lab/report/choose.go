package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// The recommendation: for each situation a user can be in, the strategy to
// use and the one to avoid, decided by one figure of this run with the
// rules below (ChoiceRules prints them). Nothing here is typed in: a
// situation the run did not measure says so.

// NoiseMargin is how far apart two figures must be for one to win: within
// it of the better one they are a tie, and the table says "either".
const NoiseMargin = 0.10

// ChoiceRules are the rules the recommendation follows, in words, for the
// report and docs/choosing.md.
var ChoiceRules = []string{
	"Only safe strategies are recommended, and only from runs whose audit passed; the controls (" + strings.Join(controlNames(), ", ") + ") never are. A safe strategy that failed the audit in a situation is the one to avoid there.",
	fmt.Sprintf("Each situation is decided by one figure, named in its row; the best figure wins. Two figures are a tie when they differ by at most %.0f%% of the better one, or, for a figure measured in several rounds (the burst's orders/s), when the two strategies' rounds overlap: the run's own round-to-round spread. A tie with the best says \"either\".", NoiseMargin*100),
	"The one to avoid is a strategy that failed there, else the worst by the same figure when it is not itself within the tie of the best.",
	"\"Database only\" takes the strategies that need no server besides the database; \"Redis too\" adds those that need Redis (one, a quorum, or a durable one). etcd and ZooKeeper count as servers of their own: their strategies compete in the rows with no such limit (a latency budget, CPU, capacity, faults).",
	"A fault row takes the latest fault-suite run the report found: a strategy survives a fault when every run of its safe configuration under that fault ended ok (nothing oversold or lost, availability as expected); a degraded or failed run, or an unsafe configuration that oversold, is the one to avoid. Every survivor is listed, the fastest hot-SKU burst of this run first.",
	"Where the run lacks the data (a quick run leaves scenarios out, a strategy may not be in the run, the fault suite may not have run), the row says so instead of guessing.",
}

func controlNames() []string {
	var out []string
	for _, name := range strategies.Names() {
		if strategies.IsControl(name) {
			out = append(out, name)
		}
	}
	return out
}

// Choice is one situation of the recommendation.
type Choice struct {
	// Situation is what the user is in; Figure what decides it.
	Situation string
	Figure    string
	// Anchor is the id of the page's section with the evidence.
	Anchor string
	// Cells are one per backend, or one for every backend (a fault row:
	// the suite mixes the engines).
	Cells []ChoiceCell
}

// ChoiceCell is the answer on one backend ("" for all of them).
type ChoiceCell struct {
	Backend string
	// Use lists the winner, and those tied with it ("either").
	Use []Pick
	// Avoid is the strategy not to use there, if one stands out.
	Avoid []Pick
	// Missing says why there is no answer (data the run lacks).
	Missing string
}

// Pick is a strategy and the figure that put it there; Apart, for the one
// to avoid, how far it is from the best ("11× slower").
type Pick struct {
	Strategy string
	Figure   string
	Apart    string
}

// measure is one candidate's figure in a situation.
type measure struct {
	strategy string
	value    float64
	// rounds are the values of every round, when measured in several.
	rounds []float64
	// failed: a safe strategy that failed the audit here; why says how.
	failed bool
	why    string
	text   string
}

// decide applies the rules to the candidates of one situation; worse is
// the word for a worse figure ("slower", "higher").
func decide(ms []measure, higherIsBetter bool, worse string) ChoiceCell {
	var cell ChoiceCell
	var ok []measure
	for _, m := range ms {
		if m.failed {
			cell.Avoid = append(cell.Avoid, Pick{Strategy: m.strategy, Figure: m.why})
			continue
		}
		ok = append(ok, m)
	}
	if len(ok) == 0 {
		if len(cell.Avoid) == 0 {
			cell.Missing = "not measured in this run"
		}
		return cell
	}
	better := func(a, b measure) int {
		if higherIsBetter {
			return cmp.Compare(b.value, a.value)
		}
		return cmp.Compare(a.value, b.value)
	}
	slices.SortStableFunc(ok, better)
	best := ok[0]
	for _, m := range ok {
		if m.strategy == best.strategy || tie(best, m) {
			cell.Use = append(cell.Use, Pick{Strategy: m.strategy, Figure: m.text})
		}
	}
	if len(cell.Avoid) == 0 && len(ok) > len(cell.Use) {
		worst := ok[len(ok)-1]
		cell.Avoid = append(cell.Avoid, Pick{Strategy: worst.strategy, Figure: worst.text, Apart: factor(best.value, worst.value) + " " + worse})
	}
	return cell
}

// tie reports whether two figures are within the noise (NoiseMargin, or
// their rounds overlap).
func tie(a, b measure) bool {
	hi, lo := max(a.value, b.value), min(a.value, b.value)
	if hi <= 0 || hi-lo <= NoiseMargin*hi {
		return true
	}
	return overlap(a.rounds, b.rounds)
}

// factor says how far apart the best and the worst are: 3.1×, for a rate
// as for a latency.
func factor(best, worst float64) string {
	if best <= 0 || worst <= 0 {
		return "–"
	}
	return fmtRatio(max(best, worst) / min(best, worst))
}

// needsOnlyDatabase: the strategy needs no server besides the database.
func needsOnlyDatabase(strategy string) bool {
	info, ok := strategies.Lookup(strategy)
	return ok && len(info.Needs) == 0
}

// needsAtMostRedis: the strategy needs at most Redis besides the
// database (one, a quorum, or a durable one).
func needsAtMostRedis(strategy string) bool {
	info, ok := strategies.Lookup(strategy)
	if !ok {
		return false
	}
	for _, n := range info.Needs {
		switch n {
		case strategies.ServerRedis, strategies.ServerRedisQuorum, strategies.ServerDurableRedis:
		default:
			return false
		}
	}
	return true
}

// Choices computes the recommendation from the run's figures.
func (r *Report) Choices() []Choice {
	burst, steady := r.Rows(Burst), r.Rows(Steady)
	rounds := "the median round"
	if r.Rounds > 1 {
		rounds = fmt.Sprintf("the median of %d rounds", r.Rounds)
	}
	var out []Choice
	perBackend := func(situation, figure, anchor string, cell func(backend string) ChoiceCell) {
		c := Choice{Situation: situation, Figure: figure, Anchor: anchor}
		for _, b := range r.Backends {
			cc := cell(b)
			cc.Backend = r.BackendLabel(b)
			c.Cells = append(c.Cells, cc)
		}
		out = append(out, c)
	}
	burstCell := func(keep func(string) bool) func(string) ChoiceCell {
		return func(backend string) ChoiceCell {
			return decide(burstMeasures(burst, backend, keep), true, "slower")
		}
	}
	perBackend("One hot SKU, final orders; database only", "burst orders/s, k6, "+rounds, "burst", burstCell(needsOnlyDatabase))
	perBackend("One hot SKU, final orders; Redis too", "burst orders/s, k6, "+rounds, "burst", burstCell(needsAtMostRedis))
	catalogCell := func(keep func(string) bool) func(string) ChoiceCell {
		return func(backend string) ChoiceCell {
			if len(r.CatalogRuns) == 0 {
				return ChoiceCell{Missing: "not measured in this run (no catalog: CATALOG_SKUS=0)"}
			}
			return decide(catalogMeasures(r, backend, keep), true, "slower")
		}
	}
	perBackend("A catalog of many SKUs; database only", "catalog orders/s, Go client", "catalog", catalogCell(needsOnlyDatabase))
	perBackend("A catalog of many SKUs; Redis too", "catalog orders/s, Go client", "catalog", catalogCell(needsAtMostRedis))
	perBackend("Orders that come back (holds)", "burst orders/s with holds on, k6", "lifecycle", func(backend string) ChoiceCell {
		if len(r.LifecycleRuns) == 0 {
			return ChoiceCell{Missing: "not measured in this run (LIFECYCLE=0)"}
		}
		return decide(lifecycleMeasures(r, backend), true, "slower")
	})
	perBackend("A latency budget", "p99 at one steady rate for all, k6, "+rounds, "steady", func(backend string) ChoiceCell {
		return decide(steadyMeasures(steady, backend), false, "higher")
	})
	perBackend("The least CPU per order", "CPU µs per 201: service + database + Redis/etcd/ZooKeeper", "cost", func(backend string) ChoiceCell {
		return decide(cpuMeasures(burst, backend), false, "more")
	})
	if r.Capacity != nil {
		perBackend(fmt.Sprintf("The most orders/s on %d + %d cores", r.Capacity.ServiceCores, r.Capacity.DatabaseCores),
			"estimate: the lowest bound of those cores, one per Redis/etcd/ZooKeeper server, and the hot row",
			"capacity", func(backend string) ChoiceCell { return decide(capacityMeasures(r, burst, backend), true, "fewer") })
	}
	if r.Failover != nil && len(r.Failover.Replication) > 0 {
		perBackend("A replicated database (Patroni, Galera)", "burst orders/s on the replicated servers, Go client, the median round", "failover", func(backend string) ChoiceCell {
			return decide(replicationMeasures(r, backend), true, "slower")
		})
	}
	for _, k := range faultKinds {
		c := Choice{Situation: "Survive " + k.situation, Figure: "fault-suite runs ok, then burst orders/s", Anchor: "faults"}
		c.Cells = []ChoiceCell{r.faultCell(k, burst)}
		out = append(out, c)
	}
	return out
}

func burstMeasures(rows []Row, backend string, keep func(string) bool) []measure {
	var out []measure
	for _, row := range rows {
		s := row.Run.Strategy
		if row.Run.Backend != backend || row.Control || !keep(s) {
			continue
		}
		switch row.Verdict.Status {
		case StatusFail:
			out = append(out, measure{strategy: s, failed: true, why: "failed the audit: " + strings.Join(row.Verdict.Problems, "; ")})
		case StatusOK:
			if row.Stats.OrdersPerSec > 0 {
				out = append(out, measure{strategy: s, value: row.Stats.OrdersPerSec, rounds: row.RoundsPerSec, text: fmtRate(row.Stats.OrdersPerSec) + " orders/s"})
			}
		}
	}
	return out
}

func catalogMeasures(r *Report, backend string, keep func(string) bool) []measure {
	var out []measure
	seen := map[string]bool{}
	for _, c := range r.Catalogs() {
		// One Redis, as the other scenarios have it; the cluster's run is
		// a deployment of its own, in the catalog's table.
		if c.Backend != backend || IsControl(c.Strategy) || !keep(c.Strategy) || c.RedisMasters > 1 || seen[c.Strategy] {
			continue
		}
		seen[c.Strategy] = true
		switch v := c.Judge(); v.Status {
		case StatusFail:
			out = append(out, measure{strategy: c.Strategy, failed: true, why: "failed the audit: " + strings.Join(v.Problems, "; ")})
		case StatusOK:
			if c.OrdersPerSec > 0 {
				out = append(out, measure{strategy: c.Strategy, value: c.OrdersPerSec, text: fmtRate(c.OrdersPerSec) + " orders/s"})
			}
		}
	}
	return out
}

func lifecycleMeasures(r *Report, backend string) []measure {
	var out []measure
	for _, l := range r.Lifecycles() {
		if l.Backend != backend || IsControl(l.Strategy) {
			continue
		}
		switch v := l.Judge(); v.Status {
		case StatusUnsupported:
			out = append(out, measure{strategy: l.Strategy, failed: true, why: "refused held orders (HOLD_TTL) in this run"})
		case StatusFail:
			out = append(out, measure{strategy: l.Strategy, failed: true, why: "failed the audit: " + strings.Join(v.Problems, "; ")})
		case StatusOK:
			if l.Burst != nil && l.Burst.OrdersPerSec > 0 {
				text := fmtRate(l.Burst.OrdersPerSec) + " orders/s"
				if l.BurstOff != nil && l.BurstOff.OrdersPerSec > 0 {
					text += ", " + fmtRatio(l.Burst.OrdersPerSec/l.BurstOff.OrdersPerSec) + " of without"
				}
				out = append(out, measure{strategy: l.Strategy, value: l.Burst.OrdersPerSec, text: text})
			}
		}
	}
	return out
}

func steadyMeasures(rows []Row, backend string) []measure {
	var out []measure
	for _, row := range rows {
		if row.Run.Backend != backend || row.Control {
			continue
		}
		switch row.Verdict.Status {
		case StatusFail:
			out = append(out, measure{strategy: row.Run.Strategy, failed: true, why: "failed the audit: " + strings.Join(row.Verdict.Problems, "; ")})
		case StatusOK:
			if row.Stats.HasLatency && row.Stats.P99 > 0 {
				text := "p99 " + fmtDur(row.Stats.P99)
				if row.Run.Rate > 0 {
					text += " at " + fmtInt(int64(row.Run.Rate)) + "/s"
				}
				out = append(out, measure{strategy: row.Run.Strategy, value: float64(row.Stats.P99) / float64(time.Millisecond), text: text})
			}
		}
	}
	return out
}

func cpuMeasures(rows []Row, backend string) []measure {
	var out []measure
	for _, row := range rows {
		cost := row.Run.SellCost
		if row.Run.Backend != backend || row.Control || row.Verdict.Status != StatusOK || cost == nil {
			continue
		}
		cpu, all := cost.stackCPU()
		if v, ok := perOrder(cpu, cost.Sold); ok && all && v > 0 {
			out = append(out, measure{strategy: row.Run.Strategy, value: v, text: fmtMicros(v, true) + " per order"})
		}
	}
	return out
}

func capacityMeasures(r *Report, burst []Row, backend string) []measure {
	var out []measure
	for _, c := range capacityRows(r, burst) {
		if c.backend != backend || c.Control || c.estimate <= 0 {
			continue
		}
		out = append(out, measure{strategy: c.Strategy, value: c.estimate, text: fmtRate(c.estimate) + " orders/s, bound by " + c.Binds})
	}
	return out
}

// faultKind is one fault a user may need to survive, and the fault
// suite's scenarios that inject it (by the first part of a run's name).
type faultKind struct {
	situation string
	scenarios []string
}

var faultKinds = []faultKind{
	{"a database kill", []string{"5-database-restart", "8-reserve-database-down", "9-catalog-database-kill", "11-lifecycle-database"}},
	{"a Redis restart", []string{"4-redis-restart", "8-reserve-redis-restart", "8-reserve-redis-wiped", "9-catalog-redis-restart", "9-catalog-redis-wiped", "10-restart-table", "12-lifecycle-redis-kill"}},
	{"an instance paused past its lock", []string{"2-paused-holder", "7-paused-holder"}},
	{"a lost lock server", []string{"3-redlock-node-loss", "3-redlock-down-rate", "7-etcd-leader-kill", "7-zk-leader-kill"}},
}

func (k faultKind) covers(run FaultRun) bool {
	scenario, _, _ := strings.Cut(run.Name, "/")
	for _, s := range k.scenarios {
		if scenario == s || strings.HasPrefix(scenario, s) {
			return true
		}
	}
	return false
}

// faultCell decides a fault row: the strategies whose every safe run
// under the fault ended ok, the fastest of them in this run's burst first.
func (r *Report) faultCell(k faultKind, burst []Row) ChoiceCell {
	if r.Faults == nil {
		return ChoiceCell{Missing: "not measured: no fault-suite results beside this run (make faults)"}
	}
	type tally struct{ ok, runs int }
	var order []string
	tallies := map[string]*tally{}
	var avoid []Pick
	// The lock strategies run with FENCING=off to show what the fence
	// prevents: one pick for all of them.
	var unfenced []string
	for _, run := range r.Faults.Runs {
		s := run.FaultStrategy()
		if !k.covers(run) || s == "" {
			continue
		}
		if run.FaultUnsafe() || IsControl(s) {
			if run.Verdict == "expected-oversell" {
				if IsControl(s) {
					avoid = append(avoid, Pick{Strategy: s, Figure: "oversold in " + run.Name})
				} else if !slices.Contains(unfenced, s) {
					unfenced = append(unfenced, s)
				}
			}
			continue
		}
		t, ok := tallies[s]
		if !ok {
			t = &tally{}
			tallies[s] = t
			order = append(order, s)
		}
		t.runs++
		if run.Verdict == "ok" {
			t.ok++
		} else {
			avoid = append(avoid, Pick{Strategy: s, Figure: string(run.Verdict) + " in " + run.Name})
		}
	}
	if len(unfenced) > 0 {
		avoid = append([]Pick{{Strategy: "FENCING=off", Figure: "oversold with " + joinAnd(unfenced)}}, avoid...)
	}
	if len(order) == 0 {
		return ChoiceCell{Missing: "not measured: the fault suite has no run of this fault", Avoid: avoid}
	}
	fastest := map[string]float64{}
	for _, row := range burst {
		if row.Verdict.Status == StatusOK {
			fastest[row.Run.Strategy] = max(fastest[row.Run.Strategy], row.Stats.OrdersPerSec)
		}
	}
	var ms []measure
	for _, s := range order {
		t := tallies[s]
		if t.ok < t.runs {
			continue
		}
		text := fmt.Sprintf("%d of %d runs ok", t.ok, t.runs)
		if v := fastest[s]; v > 0 {
			text += ", " + fmtRate(v) + " orders/s"
		}
		ms = append(ms, measure{strategy: s, value: fastest[s], text: text})
	}
	// Surviving is the property: every survivor is one to use, the
	// fastest first; the one to avoid is what broke under the fault, not
	// the slowest survivor.
	slices.SortStableFunc(ms, func(a, b measure) int { return cmp.Compare(b.value, a.value) })
	var cell ChoiceCell
	for _, m := range ms {
		cell.Use = append(cell.Use, Pick{Strategy: m.strategy, Figure: m.text})
	}
	cell.Avoid = dedupePicks(avoid)
	if len(ms) == 0 {
		cell.Missing = "no strategy came through every run of this fault"
	}
	return cell
}

func dedupePicks(ps []Pick) []Pick {
	var out []Pick
	seen := map[string]bool{}
	for _, p := range ps {
		if !seen[p.Strategy] {
			seen[p.Strategy] = true
			out = append(out, p)
		}
	}
	return out
}

// NotInRun lists the registry's safe strategies this run left out.
func (r *Report) NotInRun() []string {
	var out []string
	for _, name := range strategies.Names() {
		if !strategies.IsControl(name) && !slices.Contains(r.Strategies, name) {
			out = append(out, name)
		}
	}
	return out
}

// Short is the choice in one line, for the summary the README quotes:
// the strategies to use and where ("batched on every engine", "either
// batched or redis-reserve on PostgreSQL; batched on MariaDB"), or why
// there is no answer.
func (c Choice) Short() string {
	var parts []string
	same := true
	for i, cell := range c.Cells {
		parts = append(parts, cell.useText())
		same = same && parts[i] == parts[0]
	}
	switch {
	case len(c.Cells) == 0:
		return "not measured in this run"
	case same:
		return parts[0] + " on every engine"
	}
	for i, cell := range c.Cells {
		parts[i] += " on " + cell.Backend
	}
	return strings.Join(parts, "; ")
}

// useText names the cell's strategies to use: "batched", "either a or b".
func (cell ChoiceCell) useText() string {
	if len(cell.Use) == 0 {
		if cell.Missing != "" {
			return cell.Missing
		}
		return "none that passed"
	}
	var names []string
	for _, p := range cell.Use {
		names = append(names, p.Strategy)
	}
	if len(names) == 1 {
		return names[0]
	}
	return "either " + strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
