package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	texttemplate "text/template"
	"time"
)

//go:embed templates/index.html.tmpl
var htmlSource string

//go:embed templates/report.md.tmpl
var mdSource string

var funcs = template.FuncMap{
	"join":     strings.Join,
	"inc":      func(i int) int { return i + 1 },
	"dur":      fmtDur,
	"rate":     fmtRate,
	"int":      fmtInt,
	"secs":     fmtSeconds,
	"time":     func(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") },
	"runFiles": runFiles,
}

// fileLink is a link to one of a run's files.
type fileLink struct{ Href, Text string }

// runFiles are the links to a run's files that are beside the page.
func runFiles(p page, dashboard, dir string, metrics []string) []fileLink {
	var out []fileLink
	add := func(href, text string) {
		if p.Has(href) {
			out = append(out, fileLink{href, text})
		}
	}
	add(dashboard, "k6 dashboard")
	if dir != "" {
		add(dir+"/summary.txt", "summary")
		add(dir+"/summary.json", "summary.json")
		add(dir+"/k6.log", "k6 log")
	}
	for i, m := range metrics {
		add(m, fmt.Sprintf("/metrics i%d", i+1))
	}
	return out
}

var (
	htmlTemplate = template.Must(template.New("index.html").Funcs(funcs).Parse(htmlSource))
	// report.md shows choosing.md's table ("choicetable") too.
	mdTemplate = texttemplate.Must(texttemplate.Must(texttemplate.New("report.md").Funcs(texttemplate.FuncMap(funcs)).Parse(mdSource)).
			New(choosingFile).Parse(choosingSource)).Lookup("report.md")
)

//go:embed templates/choosing.md.tmpl
var choosingSource string

var choosingTemplate = texttemplate.Must(texttemplate.New("choosing.md").Funcs(texttemplate.FuncMap(funcs)).Parse(choosingSource))

// The files a report's folder holds beside its runs: the pages link each
// other, and the data, only where the file is there.
const (
	htmlFile     = "index.html"
	mdFile       = "report.md"
	choosingFile = "choosing.md"
)

// Exists tells whether a file a page would link, relative to the page's
// folder, is there. The pages link only what exists, so that a copy that
// leaves the runs' folders out (a published one) has no dead link.
type Exists func(rel string) bool

// InDir is Exists for the files of dir.
func InDir(dir string) Exists {
	return func(rel string) bool {
		if rel == "" || strings.Contains(rel, "://") {
			return false
		}
		_, err := os.Stat(filepath.Join(dir, filepath.FromSlash(rel)))
		return err == nil
	}
}

// WriteHTML renders the self-contained page. It links the files exists
// says are there (nil: none).
func WriteHTML(w io.Writer, r *Report, exists Exists) error {
	if err := htmlTemplate.Execute(w, buildPage(r, exists)); err != nil {
		return fmt.Errorf("report: html: %w", err)
	}
	return nil
}

// WriteMarkdown renders report.md: the same tables and facts, no charts.
func WriteMarkdown(w io.Writer, r *Report, exists Exists) error {
	if err := mdTemplate.Execute(w, buildPage(r, exists)); err != nil {
		return fmt.Errorf("report: markdown: %w", err)
	}
	return nil
}

// WriteChoosing renders choosing.md: the recommendation, its rules and
// where its figures come from. page is the report's index.html as seen
// from where choosing.md will be, for the links to the evidence;
// generatedBy, if set, is the command that wrote it.
func WriteChoosing(w io.Writer, r *Report, pageLink, generatedBy string) error {
	p := buildPage(r, nil)
	p.Page, p.GeneratedBy = pageLink, generatedBy
	if err := choosingTemplate.Execute(w, p); err != nil {
		return fmt.Errorf("report: choosing: %w", err)
	}
	return nil
}

// WriteFiles writes results.json.gz, then index.html, report.md and
// choosing.md into dir, each linking only the files dir holds.
func WriteFiles(dir string, r *Report) error {
	if err := r.Save(dir); err != nil {
		return err
	}
	return WritePages(dir, r)
}

// WritePages writes index.html, report.md and choosing.md into dir, from
// r as it is (results.json.gz is not written again).
func WritePages(dir string, r *Report) error {
	exists := InDir(dir)
	pages := []struct {
		name  string
		write func(io.Writer) error
	}{
		// choosing.md first: the others link it.
		{choosingFile, func(w io.Writer) error { return WriteChoosing(w, r, htmlFile, "") }},
		{mdFile, func(w io.Writer) error { return WriteMarkdown(w, r, exists) }},
		{htmlFile, func(w io.Writer) error { return WriteHTML(w, r, exists) }},
	}
	for _, pg := range pages {
		var buf bytes.Buffer
		if err := pg.write(&buf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, pg.name), buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
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
	// says what the catalog scenario did.
	CatalogRows []catalogRow
	CatalogLoad string
	// LifecycleRows are the lifecycle runs (orders that come back) beside
	// the bursts; LifecycleLoad says what the scenario did,
	// LifecycleFindings which bursts fell under LifecycleGoal.
	LifecycleRows     []lifecycleRow
	LifecycleLoad     string
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
	p.CatalogLoad = catalogLoad(r)
	p.LifecycleRows = lifecycleRows(r, burst)
	p.LifecycleLoad = lifecycleLoad(r)
	p.LifecycleFindings = lifecycleFindings(p.LifecycleRows)
	p.LifecycleGoal = fmtRatio(LifecycleGoal)
	p.CostRows = costRows(r, burst, steady)
	p.CapacityRows = capacityRows(r, burst)
	p.SoldOutGoalRows, p.FastPathRows, p.RatioRows = soldOutGoalRows(r, burst), fastPathRows(r, burst), ratioRows(r)
	p.CostNotes, p.CapacityNotes, p.GoalNotes = numberNotes(p.CostRows, p.CapacityRows, p.SoldOutGoalRows, p.RatioRows)
	// A situation's evidence is a section only the runs that measured it
	// have: no link to a section the page leaves out.
	shown := map[string]bool{"burst": true, "steady": true, "faults": true,
		"catalog": len(p.CatalogRows) > 0, "lifecycle": len(p.LifecycleRows) > 0,
		"cost": len(p.CostRows) > 0, "capacity": len(p.CapacityRows) > 0}
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
