package report

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/strategies"
)

// The process classes whose CPU the runner measures, as the report names
// them.
const (
	ComponentService   = "service"
	ComponentDatabase  = "database"
	ComponentRedis     = "Redis"
	ComponentEtcd      = "etcd"
	ComponentZooKeeper = "ZooKeeper"
	ComponentLoadGen   = "load generator"
)

// CPUCost is the CPU each process class spent in one window of load
// (user + system time from the kernel's accounting, /proc/PID/stat),
// beside the answers given in that window.
type CPUCost struct {
	Window time.Duration `json:"window_ns"`
	// Answered counts every answer to an order (201, 409 sold out, 503
	// busy, other), or every request of a /healthz run; Sold the 201s.
	Answered   int64           `json:"answered"`
	Sold       int64           `json:"sold"`
	Components []ComponentCost `json:"components"`
	// MachineBusy is the share of all cores' time that was busy in the
	// window (/proc/stat), MachineCPU that busy time: every process, the
	// measured ones and any other.
	MachineBusy float64       `json:"machine_busy"`
	MachineCPU  time.Duration `json:"machine_cpu_ns"`
	// Note says what the window includes beyond the load, if anything.
	Note string `json:"note,omitempty"`
}

// ComponentCost is one process class's CPU in a window.
type ComponentCost struct {
	Name      string        `json:"name"`
	Processes int           `json:"processes,omitempty"`
	CPU       time.Duration `json:"cpu_ns"`
	// Busiest is the most CPU one of its processes (or servers) used:
	// the bound of a server that runs its commands on one thread.
	Busiest time.Duration `json:"busiest_ns,omitempty"`
	// Error says why it was not measured.
	Error string `json:"error,omitempty"`
}

// Measured reports whether the component's CPU is known.
func (c ComponentCost) Measured() bool { return c.Error == "" }

// PerOrder is a CPU time per order in microseconds; ok is false without
// orders or when the component was not measured.
func perOrder(cpu time.Duration, n int64) (float64, bool) {
	if n <= 0 {
		return 0, false
	}
	return float64(cpu) / float64(time.Microsecond) / float64(n), true
}

// component returns the named component's cost, if measured in c.
func (c *CPUCost) component(name string) (ComponentCost, bool) {
	if c == nil {
		return ComponentCost{}, false
	}
	for _, cc := range c.Components {
		if cc.Name == name {
			return cc, cc.Measured()
		}
	}
	return ComponentCost{}, false
}

// coordination is the Redis, etcd or ZooKeeper component of a run, if it
// has one.
func (c *CPUCost) coordination() (ComponentCost, bool) {
	if c == nil {
		return ComponentCost{}, false
	}
	for _, cc := range c.Components {
		switch cc.Name {
		case ComponentRedis, ComponentEtcd, ComponentZooKeeper:
			return cc, true
		}
	}
	return ComponentCost{}, false
}

// stackCPU is the CPU of the processes that serve the orders (every
// component but the load generator), and whether all of them were
// measured.
func (c *CPUCost) stackCPU() (time.Duration, bool) {
	var sum time.Duration
	all := true
	for _, cc := range c.Components {
		if cc.Name == ComponentLoadGen {
			continue
		}
		if !cc.Measured() {
			all = false
			continue
		}
		sum += cc.CPU
	}
	return sum, all
}

// measuredCPU is every measured component's CPU, the load generator's too.
func (c *CPUCost) measuredCPU() (time.Duration, bool) {
	var sum time.Duration
	all := true
	for _, cc := range c.Components {
		if !cc.Measured() {
			all = false
			continue
		}
		sum += cc.CPU
	}
	return sum, all
}

// Capacity is what the report's capacity estimate assumes: the cores of
// the service's machines (all its instances together) and of the
// database's.
type Capacity struct {
	ServiceCores  int `json:"service_cores"`
	DatabaseCores int `json:"database_cores"`
}

// Saturated is the machine's busy share from which its cores count as the
// limit of a run: near 100%, with room for the scheduler's idle moments
// between a burst's answers.
const Saturated = 0.9

// CapacityTolerance is how far the measured rate may be from the in-run
// estimate where the cores were the limit.
const CapacityTolerance = 0.25

// costRow is one line of the cost table.
type costRow struct {
	Backend, Strategy, Run                          string
	Window, Answered, Sold                          string
	Service, Database, Coordination, LoadGen, Total string
	TotalPerSold                                    string
	ServicePerCoreSec, StackPerCoreSec, Busy        string
	Unmeasured, Note                                string
	Control, Healthz                                bool
	// NoteRef numbers Note among the table's notes (0: none).
	NoteRef int
}

// capacityRow is one line of the capacity estimate.
type capacityRow struct {
	Backend, Strategy                             string
	Service, Database, Coordination               string
	ServiceBound, DatabaseBound, CoordBound       string
	SerialBound, Estimate, Binds                  string
	InRun, Measured, Ratio, Busy, Check, CheckWhy string
	Outside, Control                              bool
	// CheckRef numbers CheckWhy among the table's notes (0: none).
	CheckRef int
	// backend is the raw name, estimate the lowest bound in orders/s (0
	// when none): the recommendation ranks by it.
	backend  string
	estimate float64
}

// fmtMicros writes a CPU time per order: 412 µs, 38.5 µs, 2.75 µs.
// microsCell is fmtMicros without its unit, for a table whose header has
// it.
func microsCell(v float64, ok bool) string {
	return strings.TrimSuffix(fmtMicros(v, ok), " µs")
}

func fmtMicros(v float64, ok bool) string {
	if !ok {
		return "–"
	}
	switch {
	case v >= 100:
		return fmtInt(int64(math.Round(v))) + " µs"
	case v >= 10:
		return fmt.Sprintf("%.1f µs", v)
	}
	return fmt.Sprintf("%.2f µs", v)
}

// costRowOf is one run's line: CPU per answered order by component, the
// whole 201s' cost over the selling window, and orders per core-second.
func costRowOf(r *Report, backend, strategy, run string, cost, sell *CPUCost) costRow {
	row := costRow{Backend: r.BackendLabel(backend), Strategy: strategy, Run: run, Control: IsControl(strategy)}
	row.Window, row.Answered, row.Sold = fmtDur(cost.Window), fmtInt(cost.Answered), fmtInt(cost.Sold)
	per := func(name string) string {
		for _, cc := range cost.Components {
			if cc.Name == name {
				if !cc.Measured() {
					return "not measured"
				}
				return microsCell(perOrder(cc.CPU, cost.Answered))
			}
		}
		return "–"
	}
	row.Service, row.Database, row.LoadGen = per(ComponentService), per(ComponentDatabase), per(ComponentLoadGen)
	row.Coordination = "–"
	if cc, ok := cost.coordination(); ok {
		row.Coordination = cc.Name + " " + per(cc.Name)
	}
	total, all := cost.measuredCPU()
	row.Total = microsCell(perOrder(total, cost.Answered))
	if sell != nil {
		t, _ := sell.measuredCPU()
		row.TotalPerSold = microsCell(perOrder(t, sell.Sold))
	} else {
		row.TotalPerSold = "–"
	}
	row.ServicePerCoreSec, row.StackPerCoreSec = "–", "–"
	if cc, ok := cost.component(ComponentService); ok {
		if v, ok := perOrder(cc.CPU, cost.Answered); ok && v > 0 {
			row.ServicePerCoreSec = fmtRate(1e6 / v)
		}
	}
	if stack, ok := cost.stackCPU(); ok {
		if v, ok := perOrder(stack, cost.Answered); ok && v > 0 {
			row.StackPerCoreSec = fmtRate(1e6 / v)
		}
	}
	row.Busy = fmtPercent(cost.MachineBusy)
	if cost.MachineCPU > 0 {
		other := max(0, cost.MachineCPU-total)
		row.Unmeasured = fmtPercent(float64(other) / float64(cost.MachineCPU))
	}
	var notes []string
	if !all {
		for _, cc := range cost.Components {
			if !cc.Measured() {
				notes = append(notes, cc.Name+" not measured: "+cc.Error)
			}
		}
	}
	if cost.Note != "" {
		notes = append(notes, cost.Note)
	}
	row.Note = strings.Join(notes, "; ")
	return row
}

// costRows are the cost table: every burst and steady run (median round)
// with a cost, then /healthz through both load generators.
func costRows(r *Report, burst, steady []Row) []costRow {
	var out []costRow
	for _, b := range r.Backends {
		for _, set := range []struct {
			rows []Row
			name string
		}{{burst, "burst (k6)"}, {steady, "steady (k6)"}} {
			for _, row := range set.rows {
				if row.Run.Backend != b || row.Run.Cost == nil {
					continue
				}
				out = append(out, costRowOf(r, b, row.Run.Strategy, set.name, row.Run.Cost, row.Run.SellCost))
			}
		}
		for _, g := range r.GoBursts {
			if g.Backend == b && g.Cost != nil && (g.Round == 1 || g.Round == 0) {
				out = append(out, costRowOf(r, b, g.Strategy, "burst (Go client, round 1)", g.Cost, g.Cost))
			}
		}
	}
	healthz := func(name string, c *CPUCost) {
		if c == nil {
			return
		}
		row := costRowOf(r, r.firstBackend(), "GET /healthz", name, c, nil)
		row.Backend, row.Healthz, row.Sold = "–", true, "–"
		out = append(out, row)
	}
	if r.LoadGen != nil {
		healthz("ceiling (k6)", r.LoadGen.Cost)
	}
	if r.GoLoadGen != nil {
		healthz("ceiling (Go client)", r.GoLoadGen.Cost)
	}
	return out
}

func (r *Report) firstBackend() string {
	if len(r.Backends) > 0 {
		return r.Backends[0]
	}
	return ""
}

// costChart is a backend's stacked bars: the CPU of an answered order by
// component for every strategy's burst, beside /healthz's.
func costChart(r *Report, backend string, burst []Row) template.HTML {
	c := chart{
		Width:   1000,
		Title:   fmt.Sprintf("%s: CPU per answered order in the burst, by component (k6, median round)", r.BackendLabel(backend)),
		Unit:    "µs of CPU per answered order (201, 409, 503)",
		Stacked: true,
		Legend: []legendItem{{"service", "c-service"}, {"database", "c-database"}, {"Redis / etcd / ZooKeeper", "c-coord"},
			{"load generator (k6 and the demo)", "c-loadgen"}},
	}
	classOf := map[string]string{ComponentService: "c-service", ComponentDatabase: "c-database", ComponentRedis: "c-coord",
		ComponentEtcd: "c-coord", ComponentZooKeeper: "c-coord", ComponentLoadGen: "c-loadgen"}
	add := func(label, sub string, cost *CPUCost, n int64) {
		row := barRow{Label: label, Sub: sub}
		var total float64
		for _, cc := range cost.Components {
			v, ok := perOrder(cc.CPU, n)
			if !cc.Measured() || !ok {
				continue
			}
			total += v
			row.Bars = append(row.Bars, bar{Value: v, Class: classOf[cc.Name], Title: cc.Name + ": " + fmtMicros(v, true)})
		}
		if len(row.Bars) == 0 {
			return
		}
		row.Bars[len(row.Bars)-1].Text = fmtMicros(total, true)
		c.Rows = append(c.Rows, row)
	}
	for _, row := range burst {
		if row.Run.Backend == backend && row.Run.Cost != nil {
			add(row.Run.Strategy, "", row.Run.Cost, row.Run.Cost.Answered)
		}
	}
	if r.LoadGen != nil && r.LoadGen.Cost != nil {
		add("GET /healthz", "k6 ceiling run", r.LoadGen.Cost, r.LoadGen.Cost.Answered)
	}
	return c.render()
}

// serialBound is the rate one SKU's row allows a strategy whatever the
// cores, and what it is: the hot-row ceiling measured in this run for a
// strategy that takes one order per transaction on the row, the serial
// (one connection) ceiling for one behind a lock, which hands the row on
// one order at a time. A batch or a Redis counter is not bounded by the
// row per order.
func (r *Report) serialBound(backend, strategy string) (float64, string) {
	info, _ := strategies.Lookup(strategy)
	switch info.Family {
	case strategies.FamilySQL:
		if c, ok := r.ReferenceCeiling(backend); ok {
			return c.PerSecond, "hot row"
		}
	case strategies.FamilyLock:
		for _, c := range r.MedianCeilings() {
			if c.Backend == backend && c.Workers == 1 && c.Error == "" && c.PerSecond > 0 {
				return c.PerSecond, "hot row, one connection (lock)"
			}
		}
	}
	return 0, ""
}

// capacityRows estimate each strategy's orders/s (burst, median round) on
// a machine of N cores for the service and M for the database, from its
// CPU per sold order, and check the same arithmetic against this run.
func capacityRows(r *Report, burst []Row) []capacityRow {
	if r.Capacity == nil {
		return nil
	}
	var out []capacityRow
	for _, row := range burst {
		cost := row.Run.SellCost
		if cost == nil || cost.Sold <= 0 {
			continue
		}
		c := capacityRow{Backend: r.BackendLabel(row.Run.Backend), Strategy: row.Run.Strategy, Control: row.Control, backend: row.Run.Backend}
		type bound struct {
			name string
			rate float64
		}
		var bounds []bound
		dash := func() string { return "–" }
		c.Service, c.Database, c.Coordination = dash(), dash(), dash()
		c.ServiceBound, c.DatabaseBound, c.CoordBound, c.SerialBound = dash(), dash(), dash(), dash()
		// The service's and the database's cores, each over its CPU per
		// order.
		coresBound := func(component string, cores int, micros, boundText *string) {
			cc, ok := cost.component(component)
			if !ok {
				*micros = "not measured"
				return
			}
			v, _ := perOrder(cc.CPU, cost.Sold)
			*micros = microsCell(v, true)
			if v > 0 {
				rate := float64(cores) * 1e6 / v
				*boundText = fmtRate(rate)
				bounds = append(bounds, bound{fmt.Sprintf("%s CPU (%d cores)", component, cores), rate})
			}
		}
		coresBound(ComponentService, r.Capacity.ServiceCores, &c.Service, &c.ServiceBound)
		coresBound(ComponentDatabase, r.Capacity.DatabaseCores, &c.Database, &c.DatabaseBound)
		if cc, ok := cost.coordination(); ok {
			if !cc.Measured() {
				c.Coordination = cc.Name + " not measured"
			} else {
				// A server of its own per Redis, etcd or ZooKeeper: the
				// busiest one's CPU per order bounds the rate at one
				// core (Redis runs its commands on one thread).
				v, _ := perOrder(cc.Busiest, cost.Sold)
				c.Coordination = cc.Name + " " + microsCell(v, true)
				if v > 0 {
					rate := 1e6 / v
					c.CoordBound = fmtRate(rate)
					bounds = append(bounds, bound{cc.Name + " (one core per server)", rate})
				}
			}
		}
		if rate, what := r.serialBound(row.Run.Backend, row.Run.Strategy); rate > 0 {
			c.SerialBound = fmtRate(rate)
			bounds = append(bounds, bound{what, rate})
		}
		c.Estimate, c.Binds = "–", "–"
		if len(bounds) > 0 {
			lo := bounds[0]
			for _, b := range bounds[1:] {
				if b.rate < lo.rate {
					lo = b
				}
			}
			c.Estimate, c.Binds, c.estimate = fmtRate(lo.rate), lo.name, lo.rate
		}
		c.InRun, c.Ratio, c.Measured, c.Check = "–", "–", fmtRate(row.Stats.OrdersPerSec), "–"
		c.Busy = fmtPercent(cost.MachineBusy)
		inRun, why := r.inRunEstimate(cost)
		if inRun > 0 {
			c.InRun = fmtRate(inRun)
		}
		c.Check, c.CheckWhy, c.Outside = checkInRun(r, row, cost, inRun, why)
		if inRun > 0 && row.Stats.OrdersPerSec > 0 {
			c.Ratio = fmtRatio(row.Stats.OrdersPerSec / inRun)
		}
		out = append(out, c)
	}
	return out
}

// inRunEstimate is what this machine's cores allow a run whose every
// process shares them: all cores over the CPU of a sold order, every
// measured component's (the load generator's too). why is set when it
// cannot be computed.
func (r *Report) inRunEstimate(cost *CPUCost) (float64, string) {
	total, all := cost.measuredCPU()
	v, ok := perOrder(total, cost.Sold)
	switch {
	case r.Env.Cores <= 0:
		return 0, "the machine's cores are unknown"
	case !ok || v <= 0:
		return 0, "no CPU measured"
	case !all:
		return 0, "a component was not measured"
	}
	return float64(r.Env.Cores) * 1e6 / v, ""
}

// checkInRun compares the measured rate with the in-run estimate where the
// cores were the limit, and says why a row is outside or not checked.
func checkInRun(r *Report, row Row, cost *CPUCost, inRun float64, why string) (check, reason string, outside bool) {
	measured := row.Stats.OrdersPerSec
	if inRun <= 0 || measured <= 0 {
		if why == "" {
			why = "no measured rate"
		}
		return "not checked", why, false
	}
	if cost.MachineBusy < Saturated {
		reason = fmt.Sprintf("the machine was %s busy", fmtPercent(cost.MachineBusy))
		if rate, what := r.serialBound(row.Run.Backend, row.Run.Strategy); rate > 0 && measured >= 0.75*rate {
			reason += fmt.Sprintf("; the %s bound (%s/s in this run), not cores, limited it", what, fmtRate(rate))
		} else if rate > 0 {
			reason += fmt.Sprintf("; below the %s bound (%s/s) too: waiting (commits, locks, their hand-over) limited it", what, fmtRate(rate))
			if info, _ := strategies.Lookup(row.Run.Strategy); info.Family == strategies.FamilyLock {
				reason += ", the lock's hand-over time not being measured"
			}
		} else {
			reason += "; waiting (commits, Redis's fsync, the load generator's concurrency) limited it"
		}
		return "cores not the limit", reason, false
	}
	ratio := measured / inRun
	if math.Abs(ratio-1) <= CapacityTolerance {
		return "within ±25%", "", false
	}
	total, _ := cost.measuredCPU()
	var reasons []string
	if cost.MachineCPU > 0 {
		if other := float64(cost.MachineCPU-total) / float64(cost.MachineCPU); other > 0.1 {
			// The cores the measured processes had: what the others
			// took is not theirs to sell orders with.
			left := inRun * (1 - other)
			reasons = append(reasons, fmt.Sprintf("%s of the busy CPU was in processes not measured (other work on the machine); on the cores left to the measured ones the prediction is %s/s, measured ÷ that %s",
				fmtPercent(other), fmtRate(left), fmtRatio(measured/left)))
		}
	}
	if cost.Window < 500*time.Millisecond {
		reasons = append(reasons, fmt.Sprintf("the window was %s, a few samples: start-up and tail weigh", fmtDur(cost.Window)))
	}
	if len(reasons) == 0 {
		reasons = append(reasons, "k6's sell window (from the start of the load) and the CPU window (from the first answer seen) differ")
	}
	return "outside ±25%", strings.Join(reasons, "; "), true
}
