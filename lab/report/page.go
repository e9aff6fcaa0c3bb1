package report

import (
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"time"
)

// verdictLine is the first screen's answer on safety, in one sentence.
func verdictLine(r *Report, failures []string) string {
	if len(failures) > 0 {
		return fmt.Sprintf("The demonstration failed: %s (a safe strategy oversold or lost an order, or a run did not complete).", plural(int64(len(failures)), "problem", "problems"))
	}
	if len(r.Runs) == 0 && len(r.CatalogRuns) == 0 && len(r.LifecycleRuns) == 0 {
		return "Nothing was measured."
	}
	return "Nothing oversold or lost: no safe strategy sold a unit twice or lost an order."
}

// sources says where the recommendation's figures come from, one line per
// kind of figure, from what the run measured.
func sources(r *Report) []string {
	var out []string
	when := r.Started.UTC().Format("2006-01-02 15:04 UTC")
	out = append(out, fmt.Sprintf("This run: %s × %s on %s (%d cores), %s, commit %s, %s mode; every figure is computed from its data (results.json.gz).",
		plural(int64(len(r.Strategies)), "strategy", "strategies"), plural(int64(len(r.Backends)), "backend", "backends"),
		r.Env.Host, r.Env.Cores, when, r.Env.GitCommit, r.Mode))
	var kinds []string
	if burst := r.Rows(Burst); len(burst) > 0 {
		run := burst[0].Run
		rounds := "one round"
		if r.Rounds > 1 {
			rounds = fmt.Sprintf("the median of %d rounds", r.Rounds)
		}
		kinds = append(kinds, fmt.Sprintf("Bursts: k6, %s buyers per unit, %s", fmtTick(max(r.BuyersPerUnit, float64(run.Buyers)/float64(max(run.Stock, 1)))), rounds))
	}
	if steady := r.Rows(Steady); len(steady) > 0 {
		kinds = append(kinds, "latency: k6 at one steady rate per backend")
	}
	if len(r.CatalogRuns) > 0 {
		kinds = append(kinds, fmt.Sprintf("catalog: the Go client over %s SKUs", fmtInt(int64(r.CatalogRuns[0].SKUs))))
	}
	if len(r.LifecycleRuns) > 0 {
		kinds = append(kinds, "holds: k6 bursts with HOLD_TTL and PER_USER_LIMIT on")
	}
	kinds = append(kinds, "CPU: each process's /proc accounting over the selling")
	if f := r.Faults; f != nil {
		kinds = append(kinds, "faults: "+faultsSource(f))
	} else {
		kinds = append(kinds, "faults: no fault-suite results beside this run")
	}
	out = append(out, strings.Join(kinds, "; ")+".")
	if r.Mode == "quick" {
		out = append(out, "A quick run: small bursts and one round each, so ties rest on the 10% margin alone; `make demo` measures every scenario in rounds.")
	}
	return out
}

// faultsSource names the fault-suite run a report uses: when it started,
// how long it took, its verdict.
func faultsSource(f *Faults) string {
	s := "make faults of " + f.Started.UTC().Format("2006-01-02 15:04 UTC")
	if f.Short {
		s += " (short form)"
	}
	if d := f.Duration(); d > 0 {
		s += fmt.Sprintf(", %s of %s", plural(int64(len(f.Runs)), "run", "runs"), fmtMinutes(d))
	}
	return s + ", suite verdict " + string(f.Verdict)
}

// fmtMinutes writes a duration of minutes: "22 minutes", "1 minute".
func fmtMinutes(d time.Duration) string {
	m := int64(d.Round(time.Minute) / time.Minute)
	if m < 1 {
		return fmtSeconds(d)
	}
	return plural(m, "minute", "minutes")
}

// cloneHint is how a report saved before began its commands: a
// placeholder, not a command.
const cloneHint = "git clone <this repository> && cd stock && "

// rerunCommands are the run's commands as they run in a clone of the
// repository: a report saved before began them with a clone of a
// placeholder address, which is dropped here.
func rerunCommands(r *Report) []string {
	var out []string
	for _, c := range r.Commands {
		if rest, ok := strings.CutPrefix(c, cloneHint); ok {
			c = rest
		}
		if strings.HasPrefix(c, "git checkout ") && len(out) == 0 {
			out = append(out, "# in a clone of this repository:")
		}
		out = append(out, c)
	}
	return out
}

// auditedLine says in one sentence how many runs the audit passed and how
// far the controls oversold.
func auditedLine(a audited) string {
	var parts []string
	if a.safe > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d runs of safe strategies passed the audit (bursts, steady runs, catalogs, lifecycles)", a.held, a.safe))
	}
	if a.mostOversold > 0 {
		parts = append(parts, fmt.Sprintf("the unsafe controls oversold up to %s in a run, as they are there to show", plural(a.mostOversold, "unit", "units")))
	}
	if len(parts) == 0 {
		return ""
	}
	s := strings.Join(parts, "; ") + "."
	return strings.ToUpper(s[:1]) + s[1:]
}

// notes numbers the distinct long texts of a table's cells, from 1.
type notes []string

func (n *notes) ref(text string) int {
	if text == "" {
		return 0
	}
	if i := slices.Index(*n, text); i >= 0 {
		return i + 1
	}
	*n = append(*n, text)
	return len(*n)
}

// numberNotes moves the long texts of the cost, capacity and goal tables'
// cells to notes under them: the rows keep a number.
func numberNotes(cost []costRow, capacity []capacityRow, soldOut []soldOutGoalRow, ratio []ratioRow) (costNotes, capacityNotes, goalNotes []string) {
	var c, k, g notes
	for i := range cost {
		cost[i].NoteRef = c.ref(cost[i].Note)
	}
	for i := range capacity {
		capacity[i].CheckRef = k.ref(capacity[i].CheckWhy)
	}
	for i := range soldOut {
		if !soldOut[i].Control {
			soldOut[i].ProblemsRef = g.ref(soldOut[i].Problems)
		}
	}
	for i := range ratio {
		ratio[i].ProblemsRef = g.ref(ratio[i].Problems)
	}
	return c, k, g
}

// page is what the templates show, computed once.
type page struct {
	R      *Report
	exists Exists
	// Page is the report's index.html as the page links it (its own
	// sections: "index.html" beside report.md; further away from
	// docs/choosing.md); GeneratedBy the command that wrote choosing.md.
	Page, GeneratedBy string
	OK                bool
	Failures          []string
	// Choices is the recommendation, ChoiceBackends its columns;
	// Sources says where its figures come from.
	Choices        []Choice
	ChoiceBackends []string
	Rules          []string
	NotInRun       []string
	Sources        []string
	// Rerun are the commands that rerun the comparison, as they run.
	Rerun []string
	// Verdict is the first screen's one line on safety; FaultsSource
	// names the fault-suite run the report shows.
	Verdict      string
	FaultsSource string
	// Audited is the verdict's figures in one sentence.
	Audited string
	// Headline is one sentence on safety, Findings one paragraph per
	// backend on speed.
	Headline  string
	Findings  []finding
	Ceilings  []ceilingRow
	LoadGen   *LoadGen
	GoLoadGen *GoLoadGen
	// BatchRows line up every burst with both load generators and its
	// batch sizes.
	BatchRows []batchRow
	// ReserveRows: the bursts of the strategies that answer before the
	// database has the order (redis-reserve, redis-watch).
	ReserveRows []reserveRow
	// CatalogRows are the catalog runs beside the bursts; CatalogLoad
	// says what the catalog scenario did, CatalogKnee how its load was
	// raised step by step ("" when it was not).
	CatalogRows              []catalogRow
	CatalogLoad, CatalogKnee string
	// CatalogGoalRows hold batched's and redis-reserve's catalogs against
	// their goals (knee.go).
	CatalogGoalRows                                                []catalogGoalRow
	CatalogVsBurstGoal, CatalogVsConditionalGoal, CatalogDBCPUGoal string
	// LifecycleRows are the lifecycle runs (orders that come back) beside
	// the bursts; LifecycleLoad says what the scenario did,
	// LifecycleGoShape what the Go client's one-instance burst did,
	// LifecycleFindings which bursts fell under LifecycleGoal.
	LifecycleRows     []lifecycleRow
	LifecycleLoad     string
	LifecycleGoShape  string
	LifecycleFindings []string
	LifecycleGoal     string
	Backends          []backendView
	Burst             []tableRow
	Steady            []tableRow
	Strats            []Strategy
	RunLinks          []runLink
	BurstLoad         string
	StdyLoad          string
	Duration          string
	// CostRows are the CPU per order by component; CapacityRows the
	// estimate drawn from them and its check against this run.
	CostRows     []costRow
	CapacityRows []capacityRow
	// The cost goals: sold-out answers, the fast paths' orders, the ratio
	// burst (goals.go).
	SoldOutGoalRows []soldOutGoalRow
	FastPathRows    []fastPathRow
	RatioRows       []ratioRow
	// CostNotes, CapacityNotes and GoalNotes are the long texts of
	// those tables' cells, as numbered notes under them, so that the
	// tables fit the page's column.
	CostNotes, CapacityNotes, GoalNotes []string
	SoldOutCPUGoal                      string
	FastPathCPUGoal                     string
	RatioGoal                           string
	// The failover section (failover.go): what replication costs, and
	// what a lost primary cost.
	ReplicationRows   []replicationRow
	FailoverFaultRows []failoverFaultRow
	ReplicationGoal   string
	// ReplicationGoalNames are the strategies the goal names.
	ReplicationGoalNames []string
	// Busy: the load average exceeded the core count before the run.
	Busy bool
	// Scope is "6 strategies × 2 backends".
	Scope string
}

type finding struct {
	Backend  string
	Lines    []string
	Control  []string
	Ceilings []ceilingRow
}

type ceilingRow struct {
	Backend, Statement, SQL, PerSec, Workers, P50, P99, Failed, Error string
	Reference, Serial                                                 bool
	// Spread is every round's rate when there were several.
	Spread string
}

type backendView struct {
	Name, Label                 string
	Orders, Latency, Oversell   template.HTML
	Catalog                     template.HTML
	Cost                        template.HTML
	BurstLatency, SteadyLatency template.HTML
	HasCeiling                  bool
	CeilingText, ForUpdateText  string
	ceilingValue                float64
}

type tableRow struct {
	Backend, BackendLabel, Strategy              string
	Orders, OrdersPerSec, RequestsPerSec, Window string
	P50, P95, P99                                string
	// P99Split is "p99 of the 201s / of the sold-out 409s".
	P99Split                                                string
	SoldOut, Busy, Errors, Dropped, Offered                 string
	Available, Oversold, Conservation, Ratio, Status        string
	StatusClass, Problems, Dashboard, Dir, Untold, Requests string
	Control, Bad, OversoldRed, AvailableRed                 bool
	// CeilingName names the backend's reference ceiling, which × ceiling
	// divides by, on the first row of a backend.
	CeilingName string
	// First marks the first row of a backend, which opens its group.
	First bool
	// Spread lists every round's orders/s when there were several.
	Spread string
}

type runLink struct {
	Label, Dir, Dashboard, Command string
	Metrics                        []string
}

// BackendLabel names a backend for people: PostgreSQL, MariaDB or MySQL.
func (r *Report) BackendLabel(backend string) string {
	switch backend {
	case "postgres":
		return "PostgreSQL"
	case "mysql":
		if strings.Contains(strings.ToLower(r.Env.MySQL), "mariadb") {
			return "MariaDB"
		}
		return "MySQL"
	}
	return backend
}

// Has reports whether the page may link rel: the file is beside it.
func (p page) Has(rel string) bool { return p.exists != nil && p.exists(rel) }

func buildPage(r *Report, exists Exists) page {
	p := page{R: r, exists: exists, Page: htmlFile, LoadGen: r.LoadGen, GoLoadGen: r.GoLoadGen}
	p.Choices, p.Rules, p.NotInRun = r.Choices(), ChoiceRules, r.NotInRun()
	for _, b := range r.Backends {
		p.ChoiceBackends = append(p.ChoiceBackends, r.BackendLabel(b))
	}
	p.Sources = sources(r)
	if r.Faults != nil {
		p.FaultsSource = faultsSource(r.Faults)
	}
	p.Rerun = rerunCommands(r)
	p.Scope = fmt.Sprintf("%s × %s", plural(int64(len(r.Strategies)), "strategy", "strategies"), plural(int64(len(r.Backends)), "backend", "backends"))
	p.Failures = r.Failures()
	// Only the load before the run says something about other work: during
	// the run, k6, the instances and the databases load the machine
	// themselves.
	if f := strings.Fields(r.Env.LoadAtStart); len(f) > 0 && r.Env.Cores > 0 {
		if v, err := strconv.ParseFloat(f[0], 64); err == nil && v > float64(r.Env.Cores) {
			p.Busy = true
		}
	}
	p.OK = len(p.Failures) == 0
	if !r.Finished.IsZero() && !r.Started.IsZero() {
		p.Duration = r.Finished.Sub(r.Started).Round(time.Second).String()
	}

	burst, steady := r.Rows(Burst), r.Rows(Steady)
	p.Burst, p.Steady = tableRows(r, burst), tableRows(r, steady)
	for _, rows := range [][]tableRow{p.Burst, p.Steady} {
		for i := range rows {
			if !p.Has(rows[i].Dashboard) {
				rows[i].Dashboard = ""
			}
		}
	}
	if len(burst) > 0 {
		run := burst[0].Run
		p.BurstLoad = fmt.Sprintf("%s buyers for %s units (1 each), %s virtual users clicking at once, spread over %d instances",
			fmtInt(int64(run.Buyers)), fmtInt(run.Stock), fmtInt(int64(run.VUs)), run.Instances)
		if r.BuyersPerUnit > 0 {
			var sized []string
			for _, row := range burst {
				if row.Run.Stock != run.Stock {
					sized = append(sized, fmt.Sprintf("%s on %s: %s buyers for %s units", row.Run.Strategy, r.BackendLabel(row.Run.Backend), fmtInt(int64(row.Run.Buyers)), fmtInt(row.Run.Stock)))
				}
			}
			p.BurstLoad += fmt.Sprintf("; the same %s buyers per unit for every strategy", strconv.FormatFloat(r.BuyersPerUnit, 'f', -1, 64))
			if len(sized) > 0 {
				p.BurstLoad += " (" + strings.Join(sized, "; ") + ": sized so that its burst lasts at least BURST_MIN_SECONDS at k6's /healthz ceiling)"
			}
		}
	}
	p.BatchRows = batchRows(r, burst)
	p.ReserveRows = reserveRows(r, burst)
	p.CatalogRows = catalogRows(r, burst)
	p.CatalogLoad, p.CatalogKnee = catalogLoad(r), catalogKnee(r)
	p.CatalogGoalRows = catalogGoalRows(r, burst)
	p.CatalogVsBurstGoal, p.CatalogVsConditionalGoal, p.CatalogDBCPUGoal = fmtRatio(CatalogVsBurstGoal), fmtRatio(CatalogVsConditionalGoal), fmtRatio(CatalogDBCPUGoal)
	p.LifecycleRows = lifecycleRows(r, burst)
	p.LifecycleLoad = lifecycleLoad(r)
	p.LifecycleGoShape = lifecycleGoShapeLoad(r)
	p.LifecycleFindings = lifecycleFindings(p.LifecycleRows)
	p.LifecycleGoal = fmtRatio(LifecycleGoal)
	p.CostRows = costRows(r, burst, steady)
	p.CapacityRows = capacityRows(r, burst)
	p.SoldOutGoalRows, p.FastPathRows, p.RatioRows = soldOutGoalRows(r, burst), fastPathRows(r, burst), ratioRows(r)
	p.ReplicationRows, p.FailoverFaultRows, p.ReplicationGoal = replicationRows(r), failoverFaultRows(r), fmtRatio(ReplicationGoal)
	p.ReplicationGoalNames = ReplicationGoalStrategies
	p.CostNotes, p.CapacityNotes, p.GoalNotes = numberNotes(p.CostRows, p.CapacityRows, p.SoldOutGoalRows, p.RatioRows)
	// A situation's evidence is a section only the runs that measured it
	// have: no link to a section the page leaves out.
	shown := map[string]bool{"burst": true, "steady": true, "faults": true,
		"catalog": len(p.CatalogRows) > 0, "lifecycle": len(p.LifecycleRows) > 0,
		"cost": len(p.CostRows) > 0, "capacity": len(p.CapacityRows) > 0,
		"failover": len(p.ReplicationRows)+len(p.FailoverFaultRows) > 0}
	for i := range p.Choices {
		if !shown[p.Choices[i].Anchor] {
			p.Choices[i].Anchor = ""
		}
	}
	p.SoldOutCPUGoal, p.FastPathCPUGoal, p.RatioGoal = fmtRatio(SoldOutCPUGoal), fmtRatio(FastPathCPUGoal), fmtRatio(RatioGoal)
	if len(steady) > 0 {
		run := steady[0].Run
		rates := map[string]int{}
		for _, row := range steady {
			rates[r.BackendLabel(row.Run.Backend)] = row.Run.Rate
		}
		var parts []string
		for _, b := range r.Backends {
			if v, ok := rates[r.BackendLabel(b)]; ok {
				parts = append(parts, fmt.Sprintf("%s orders/s on %s", fmtInt(int64(v)), r.BackendLabel(b)))
			}
		}
		p.StdyLoad = fmt.Sprintf("%s offered for %s (constant-arrival-rate, up to %s orders in flight), over %d instances; stock never runs out",
			strings.Join(parts, ", "), run.Duration, fmtInt(int64(run.VUs)), run.Instances)
	}

	p.Headline = headline(r, burst, steady)
	p.Verdict = verdictLine(r, p.Failures)
	p.Audited = auditedLine(auditedRuns(r, burst, steady))
	for _, b := range r.Backends {
		v := backendViewOf(r, b, burst, steady)
		v.Catalog = catalogChart(r, b, burst)
		v.Cost = costChart(r, b, burst)
		p.Backends = append(p.Backends, v)
	}
	for _, b := range r.Backends {
		ref, hasRef := r.ReferenceCeiling(b)
		for _, c := range r.MedianCeilings() {
			if c.Backend != b {
				continue
			}
			var spread []string
			if len(c.RoundsPerSec) > 1 {
				for _, v := range c.RoundsPerSec {
					spread = append(spread, fmtRate(v))
				}
			}
			p.Ceilings = append(p.Ceilings, ceilingRow{
				Spread:  strings.Join(spread, " · "),
				Backend: r.BackendLabel(b), Statement: c.Statement, SQL: c.SQL,
				PerSec: fmtRate(c.PerSecond), Workers: fmtInt(int64(c.Workers)),
				P50: fmtDur(c.P50), P99: fmtDur(c.P99), Failed: fmtInt(c.Failed), Error: c.Error,
				Reference: hasRef && ref.Statement == c.Statement && ref.Workers == c.Workers,
				Serial:    c.Workers == 1,
			})
		}
	}
	for _, b := range r.Backends {
		f := findingOf(r, b, burst)
		for _, c := range p.Ceilings {
			if c.Backend == f.Backend {
				f.Ceilings = append(f.Ceilings, c)
			}
		}
		p.Findings = append(p.Findings, f)
	}
	for _, s := range r.Strategies {
		p.Strats = append(p.Strats, DescribeStrategy(s))
	}
	for _, run := range r.Runs {
		p.RunLinks = append(p.RunLinks, runLink{
			Label:     fmt.Sprintf("%s · %s · %s", r.BackendLabel(run.Backend), run.Strategy, run.Scenario) + roundLabel(r.Rounds, run.Round),
			Dir:       run.Dir,
			Dashboard: run.Dashboard,
			Command:   run.Command,
			Metrics:   run.Metrics,
		})
	}
	for _, l := range r.Lifecycles() {
		label := fmt.Sprintf("%s · %s · lifecycle", r.BackendLabel(l.Backend), l.Strategy)
		on, off := l.bursts()
		for i, b := range on {
			p.RunLinks = append(p.RunLinks, runLink{Label: label + ": burst with it on" + pairSuffix(len(on), i), Dir: b.Dir, Dashboard: b.Dashboard, Command: b.Command})
		}
		for i, b := range off {
			if b.Dir != "" {
				p.RunLinks = append(p.RunLinks, runLink{Label: label + ": burst without it" + pairSuffix(len(off), i), Dir: b.Dir, Dashboard: b.Dashboard, Command: b.Command})
			}
		}
		if l.Command != "" {
			p.RunLinks = append(p.RunLinks, runLink{Label: label + ": the sale", Dir: l.Dir + "/sale", Dashboard: l.Dashboard, Command: l.Command, Metrics: l.Metrics})
		}
	}
	return p
}

// audited counts the runs of safe strategies and those that passed the
// audit, the lifecycle's among them, and says what the controls oversold.
type audited struct {
	safe, held, lifecycles int
	controlOversold        []string
	// mostOversold is the most units a control oversold in one run.
	mostOversold int64
}

func auditedRuns(r *Report, rows ...[]Row) audited {
	var safe, held int
	for _, run := range r.Runs {
		if IsControl(run.Strategy) {
			continue
		}
		safe++
		if run.Judge().Status == StatusOK {
			held++
		}
	}
	var controlOversold []string
	var most int64
	for _, set := range rows {
		for _, row := range set {
			if row.Verdict.Status == StatusControlOversold {
				controlOversold = append(controlOversold, fmt.Sprintf("up to %s on %s (%s)",
					plural(row.Verdict.Oversold, "unit", "units"), r.BackendLabel(row.Run.Backend), row.Run.Scenario))
				most = max(most, row.Verdict.Oversold)
			}
		}
	}
	// A catalog run is one run: it passes when every SKU is exact.
	for _, c := range r.Catalogs() {
		v := c.Judge()
		if v.Status == StatusControlOversold {
			controlOversold = append(controlOversold, fmt.Sprintf("up to %s of one SKU on %s (catalog)",
				plural(v.Oversold, "unit", "units"), r.BackendLabel(c.Backend)))
			most = max(most, v.Oversold)
		}
		if IsControl(c.Strategy) {
			continue
		}
		safe++
		if v.Status == StatusOK {
			held++
		}
	}
	// A lifecycle run that ran is one run too: it passes when its audit
	// stayed consistent and every unit was paid.
	lifecycles := 0
	for _, l := range r.Lifecycles() {
		v := l.Judge()
		if v.Status == StatusControlOversold {
			controlOversold = append(controlOversold, fmt.Sprintf("up to %s on %s (lifecycle)",
				plural(v.Oversold, "unit", "units"), r.BackendLabel(l.Backend)))
			most = max(most, v.Oversold)
		}
		if IsControl(l.Strategy) || v.Status == StatusUnsupported {
			continue
		}
		safe++
		lifecycles++
		if v.Status == StatusOK {
			held++
		}
	}
	return audited{safe: safe, held: held, lifecycles: lifecycles, controlOversold: controlOversold, mostOversold: most}
}
