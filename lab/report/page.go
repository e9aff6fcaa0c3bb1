package report

import (
	"fmt"
	"slices"
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
	return s + ", suite verdict " + f.Verdict
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
