package report

import (
	"fmt"
	"slices"
	"strings"

	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/faults"
)

// Failover is the failover section (FAILOVER=1): what running on
// replicated servers costs each strategy, against the same strategy on the
// single server in the same run, and what losing a primary mid-sale cost.
type Failover struct {
	// Replication holds each strategy's bursts on a single server and on
	// a replicated one, taking turns round by round.
	Replication []*Replication `json:"replication,omitempty"`
	// Faults are the failover scenarios of the fault suite (14 Redis under
	// Sentinel, 15 Patroni, 16 Galera), run by the demo; Short when in
	// their short forms.
	Faults []faults.Result `json:"faults,omitempty"`
	Short  bool            `json:"short,omitempty"`
	// Errors say why a part could not run (a cluster that did not start).
	Errors []string `json:"errors,omitempty"`
}

// Clusters, as Replication.Cluster names them.
const (
	ClusterPatroni = "patroni"
	ClusterGalera  = "galera"
	// ClusterGaleraOneWriter is the same Galera cluster with every
	// instance writing through one node.
	ClusterGaleraOneWriter = "galera-one-writer"
	ClusterSentinel        = "sentinel"
)

// ReplicationGoal is issue 39's: with synchronous replication, the burst of
// the ReplicationGoalStrategies keeps at least this much of its rate on a
// single server.
const ReplicationGoal = 0.6

// ReplicationGoalStrategies are those the goal names.
var ReplicationGoalStrategies = []string{strategies.NameBatched, strategies.NameRedisReserve}

// Replication is one strategy on one backend, on the single server and on
// Cluster, Single[i] and Replicated[i] measured one after the other.
type Replication struct {
	Backend  string `json:"backend"`
	Cluster  string `json:"cluster"`
	Strategy string `json:"strategy"`
	// Setup describes the replicated servers ("Patroni, 2 members,
	// synchronous").
	Setup      string    `json:"setup"`
	Single     []GoBurst `json:"single"`
	Replicated []GoBurst `json:"replicated"`
	Error      string    `json:"error,omitempty"`
}

// Ratios are the rounds' replicated ÷ single orders/s, in round order.
func (r *Replication) Ratios() []float64 {
	var out []float64
	for i := range min(len(r.Single), len(r.Replicated)) {
		if s, x := r.Single[i].OrdersPerSec, r.Replicated[i].OrdersPerSec; s > 0 && x > 0 {
			out = append(out, x/s)
		}
	}
	return out
}

// problems are what makes the comparison a failure: a burst that
// oversold, lost an order or failed on either side, or a pair that could
// not run.
func (r *Replication) problems() []string {
	var out []string
	if r.Error != "" {
		out = append(out, r.Error)
	}
	for side, runs := range map[string][]GoBurst{"single": r.Single, r.Cluster: r.Replicated} {
		for _, g := range runs {
			for _, p := range g.Problems() {
				out = append(out, fmt.Sprintf("%s round %d: %s", side, g.Round, p))
			}
		}
	}
	slices.Sort(out)
	return out
}

// replicationRow is a row of the section's first table.
type replicationRow struct {
	Backend, Setup, Strategy string
	Single, Replicated       string // orders/s: median (each round)
	Ratio                    string // median of the rounds' ratios (each)
	Met                      string // yes, no, or "" where the goal does not apply
	ServiceSingle, ServiceRe string // service µs per 201, median round
	DBSingle, DBRe           string // database (or Redis) µs per 201
	Problems                 string
}

func replicationRows(r *Report) []replicationRow {
	if r.Failover == nil {
		return nil
	}
	var out []replicationRow
	for _, x := range r.Failover.Replication {
		row := replicationRow{Backend: r.BackendLabel(x.Backend), Setup: x.Setup, Strategy: x.Strategy,
			Single: "–", Replicated: "–", Ratio: "–", ServiceSingle: "–", ServiceRe: "–", DBSingle: "–", DBRe: "–",
			Problems: strings.Join(x.problems(), "; ")}
		rates := func(runs []GoBurst) string {
			var v []float64
			for _, g := range runs {
				v = append(v, g.OrdersPerSec)
			}
			if len(v) == 0 {
				return "–"
			}
			return fmtRate(medianFloat(v)) + roundsSuffix(v, fmtRate)
		}
		row.Single, row.Replicated = rates(x.Single), rates(x.Replicated)
		ratios := x.Ratios()
		if len(ratios) > 0 {
			row.Ratio = fmtRatio(medianFloat(ratios)) + roundsSuffix(ratios, fmtRatio)
			mid := medianPair(x.Replicated[:len(ratios)], x.Single[:len(ratios)])
			row.ServiceSingle, row.DBSingle = perSold(x.Single[mid].Cost)
			row.ServiceRe, row.DBRe = perSold(x.Replicated[mid].Cost)
		}
		if slices.Contains(ReplicationGoalStrategies, x.Strategy) {
			row.Met = goalMark(len(ratios) > 0, medianFloat(ratios) >= ReplicationGoal)
		}
		out = append(out, row)
	}
	return out
}

// roundsSuffix is " (a · b · c)" for several rounds, "" for one.
func roundsSuffix(v []float64, f func(float64) string) string {
	if len(v) < 2 {
		return ""
	}
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = f(x)
	}
	return " (" + strings.Join(parts, " · ") + ")"
}

// perSold is the service's and the servers' (database, Redis) CPU µs per
// 201 of a burst.
func perSold(c *CPUCost) (service, servers string) {
	service, servers = "–", "–"
	if c == nil || c.Sold <= 0 {
		return service, servers
	}
	var svc, srv float64
	var haveSvc, haveSrv bool
	for _, comp := range c.Components {
		if comp.Error != "" {
			continue
		}
		switch comp.Name {
		case ComponentService:
			svc, haveSvc = svc+comp.CPU.Seconds(), true
		case ComponentDatabase, ComponentRedis:
			srv, haveSrv = srv+comp.CPU.Seconds(), true
		}
	}
	service = fmtMicros(svc*1e6/float64(c.Sold), haveSvc)
	servers = fmtMicros(srv*1e6/float64(c.Sold), haveSrv)
	return service, servers
}

// failoverFaultRow is a row of the section's second table: one failover
// scenario run.
type failoverFaultRow struct {
	Scenario, Name, Engine, Strategy string
	Control                          bool
	Verdict                          string
	Created, Lost, Oversold          string
	FirstAfter                       string // the first 201 after the fault
	Between                          string // 503s and unanswered requests from the fault on
	// Bad: a safe run that failed, or a control that was not caught.
	Bad bool
}

func failoverFaultRows(r *Report) []failoverFaultRow {
	if r.Failover == nil {
		return nil
	}
	var out []failoverFaultRow
	for _, f := range r.Failover.Faults {
		row := failoverFaultRow{Scenario: fmt.Sprint(f.Scenario), Name: f.Name, Engine: f.Config.Engine,
			Strategy: f.FaultStrategy(), Control: f.FaultUnsafe(), Verdict: string(f.Verdict),
			Created: fmtInt(int64(f.Figures.Created)), Lost: fmtInt(int64(f.Figures.LostOrders)),
			Oversold: fmtInt(f.Figures.OversoldUnits), FirstAfter: "–", Between: "–"}
		if f.Scenario == 14 {
			row.Engine += " + Redis under Sentinel"
		}
		if s := f.Figures.RecoverySeconds; s != nil {
			row.FirstAfter = fmt.Sprintf("%.1f s", *s)
		}
		if p := faultPhase(f); p != nil {
			row.Between = fmt.Sprintf("%s 503 · %s no answer (%s)", fmtInt(int64(p.Figures.Responses503)), fmtInt(int64(p.Figures.NoAnswer)), p.Name)
		}
		problem := failoverFaultProblem(f)
		// Degraded (the service sold again later than the goal, nothing
		// lost) is shown in bold, not counted a failure, as the fault
		// suite counts it.
		row.Bad = problem != "" || f.Verdict == faults.VerdictDegraded
		if row.Control && problem == "" {
			row.Verdict = "caught"
		}
		out = append(out, row)
	}
	return out
}

// faultPhase is the phase of a run that begins with its fault (the primary
// lost, killed or gone), nil when the run has none.
func faultPhase(f faults.Result) *faults.Phase {
	for i := range f.Phases {
		name := f.Phases[i].Name
		if strings.Contains(name, "lost") || strings.Contains(name, "killed") || strings.Contains(name, "gone") {
			return &f.Phases[i]
		}
	}
	return nil
}

// failoverFaultProblem says what makes a failover run a failure of the
// demo: a safe run that failed or could not run, or a control that was not
// caught (issue 39: caught every time); "" when it did what it should. A
// degraded run (sold again later than the goal, nothing lost) is not one,
// as in the fault suite's verdict.
func failoverFaultProblem(f faults.Result) string {
	switch {
	case f.FaultUnsafe() && f.Verdict == faults.VerdictExpectedOversell:
		return ""
	case f.FaultUnsafe() && f.Verdict == faults.VerdictOK:
		return "the control was not caught: nothing was lost or oversold"
	case f.FaultUnsafe():
		return "the control's run " + string(f.Verdict) + ": " + strings.Join(append(append([]string{f.Error}, f.Failures...), f.Warnings...), "; ")
	case f.Verdict == faults.VerdictOK, f.Verdict == faults.VerdictDegraded:
		return ""
	}
	return string(f.Verdict) + ": " + strings.Trim(strings.Join(append(append([]string{f.Error}, f.Failures...), f.Warnings...), "; "), "; ")
}

// failoverFailures are the section's lines in Failures.
func (r *Report) failoverFailures() []string {
	if r.Failover == nil {
		return nil
	}
	out := slices.Clone(r.Failover.Errors)
	for _, x := range r.Failover.Replication {
		for _, p := range x.problems() {
			out = append(out, fmt.Sprintf("%s/%s on %s: %s", x.Backend, x.Strategy, x.Cluster, p))
		}
	}
	for _, f := range r.Failover.Faults {
		if p := failoverFaultProblem(f); p != "" {
			out = append(out, fmt.Sprintf("failover %s: %s", f.Name, p))
		}
	}
	return out
}

// replicationMeasures are the candidates of the recommendation's row for a
// replicated database: each strategy's rate on backend's replicated form
// as the issue shapes it (not Redis under Sentinel, whose database is the
// single one; not Galera's one-writer variant). A
// strategy whose comparison had a problem, or whose failover run on that
// engine did not pass, is the one to avoid.
func replicationMeasures(r *Report, backend string) []measure {
	failedFault := map[string]string{}
	for _, f := range r.Failover.Faults {
		if f.Config.Engine == backend && f.Scenario != 14 && !f.FaultUnsafe() && failoverFaultProblem(f) != "" {
			failedFault[f.FaultStrategy()] = string(f.Verdict) + " in " + f.Name
		}
	}
	var out []measure
	for _, x := range r.Failover.Replication {
		if x.Backend != backend || x.Cluster == ClusterSentinel || x.Cluster == ClusterGaleraOneWriter {
			continue
		}
		if ps := x.problems(); len(ps) > 0 {
			out = append(out, measure{strategy: x.Strategy, failed: true, why: strings.Join(ps, "; ")})
			continue
		}
		if why, bad := failedFault[x.Strategy]; bad {
			out = append(out, measure{strategy: x.Strategy, failed: true, why: why})
			continue
		}
		var rates []float64
		for _, g := range x.Replicated {
			rates = append(rates, g.OrdersPerSec)
		}
		if v := medianFloat(rates); v > 0 {
			text := fmtRate(v) + " orders/s"
			if ratios := x.Ratios(); len(ratios) > 0 {
				text += ", " + fmtRatio(medianFloat(ratios)) + " of one server"
			}
			out = append(out, measure{strategy: x.Strategy, value: v, rounds: rates, text: text})
		}
	}
	return out
}

// failoverHeadline is the headline's sentence on the failover section:
// what the primaries lost, and the controls; "" without the section.
func failoverHeadline(r *Report) string {
	if r.Failover == nil || len(r.Failover.Faults) == 0 {
		return ""
	}
	var safe, held, controls, caught int
	for _, f := range r.Failover.Faults {
		ok := failoverFaultProblem(f) == ""
		if f.FaultUnsafe() {
			controls++
			if ok {
				caught++
			}
			continue
		}
		safe++
		if ok {
			held++
		}
	}
	s := fmt.Sprintf(" On replicated servers, %d of %d runs that lost a primary or a node mid-sale lost no order answered 201 and oversold nothing", held, safe)
	if held == safe {
		s = fmt.Sprintf(" On replicated servers, all %d runs that lost a primary or a node mid-sale lost no order answered 201 and oversold nothing", safe)
	}
	return s + fmt.Sprintf("; %d of %d controls were caught losing or overselling.", caught, controls)
}
