package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Lifecycle is the lifecycle scenario of one strategy on one backend: the
// orders that come back (HOLD_TTL, PER_USER_LIMIT; docs/api.md, "Orders
// that come back"). Two runs on fresh instances:
//
//   - the sale: Stock units, Buyers buyers (loadtest/lifecycle.js); every
//     order is held for HoldTTL; a winner pays, cancels or walks away and
//     lets the hold lapse, the unit goes back on sale, and the buyers still
//     waiting retry until every unit is paid or RunFor ends; a share of the
//     buyers click twice at once and must be refused limit_reached;
//   - the burst with the lifecycle on (Burst): the demo's k6 burst, the same
//     units, buyers and VUs, on instances with a long hold and
//     PER_USER_LIMIT=1, to set beside the same strategy's burst without it.
type Lifecycle struct {
	Backend   string `json:"backend"`
	Strategy  string `json:"strategy"`
	Instances int    `json:"instances"`
	// Unsupported is the instances' refusal when the strategy does not
	// take held orders yet: then nothing ran and the row says so.
	Unsupported string `json:"unsupported,omitempty"`

	HoldTTL      time.Duration `json:"hold_ttl_ns"`
	SweepEvery   time.Duration `json:"sweep_every_ns"`
	PerUserLimit int           `json:"per_user_limit"`
	SKU          string        `json:"sku,omitempty"`
	Stock        int64         `json:"stock"`
	Buyers       int           `json:"buyers"`
	VUs          int           `json:"vus"`
	RunFor       time.Duration `json:"run_for_ns"`
	// The buyers' choices, in percent: of the winners PayPercent pay; of
	// the others CancelPercent cancel and the rest let the hold lapse;
	// TwicePercent of the buyers send their first order twice at once.
	PayPercent    int `json:"pay_percent"`
	CancelPercent int `json:"cancel_percent"`
	TwicePercent  int `json:"twice_percent"`
	RetryPauseMs  int `json:"retry_pause_ms"`

	// What the buyers were told (k6's counters).
	Orders        int64 `json:"orders"`
	SoldOut       int64 `json:"sold_out"`
	LimitReached  int64 `json:"limit_reached"`
	SecondOrders  int64 `json:"second_orders"`
	LimitBreached int64 `json:"limit_breached,omitempty"`
	Busy          int64 `json:"busy"`
	Errors        int64 `json:"errors"`
	Paid          int64 `json:"paid"`
	PayRefused    int64 `json:"pay_refused,omitempty"`
	Cancelled     int64 `json:"cancelled"`
	CancelRefused int64 `json:"cancel_refused,omitempty"`
	Abandoned     int64 `json:"abandoned"`
	GaveUp        int64 `json:"gave_up"`
	// LastPaid is when the last pay succeeded, from the start of the sale.
	LastPaid time.Duration `json:"last_paid_ns,omitempty"`
	// ExitCode is k6's (99: the teardown's audit checks failed).
	ExitCode int `json:"exit_code"`

	// Audit is GET /admin/audit/{sku} once no hold is left (every
	// abandoned hold lapsed and swept), or when that wait timed out.
	Audit *Audit `json:"audit,omitempty"`
	// Resale is the resale delays, from the database's order rows.
	Resale *Resale `json:"resale,omitempty"`
	// OverLimit counts the buyers whose held and paid units exceed
	// PerUserLimit, from the database's order rows.
	OverLimit int64 `json:"over_limit"`

	// Burst is the burst with the lifecycle on, BurstOff the same burst
	// without it, right after, on fresh instances too. The ratio falls
	// back on the strategy's burst in the main table (median round) when
	// BurstOff has no rate. With several pairs (LIFECYCLE_BURST_ROUNDS),
	// BurstRounds and BurstOffRounds are every pair's, in order, and
	// Burst and BurstOff the ones with the median rate (SetBursts).
	Burst          *LifecycleBurst   `json:"burst,omitempty"`
	BurstOff       *LifecycleBurst   `json:"burst_off,omitempty"`
	BurstRounds    []*LifecycleBurst `json:"burst_rounds,omitempty"`
	BurstOffRounds []*LifecycleBurst `json:"burst_off_rounds,omitempty"`
	// GoShape is the same comparison in the peers' shape (one instance,
	// the Go client), for LIFECYCLE_GO_STRATEGIES.
	GoShape *LifecycleGoShape `json:"go_shape,omitempty"`

	Dir     string `json:"dir,omitempty"`
	Command string `json:"command,omitempty"`
	// Dashboard (k6's) and Metrics (the instances' /metrics) are the
	// sale's, relative to the report's directory.
	Dashboard string        `json:"dashboard,omitempty"`
	Metrics   []string      `json:"metrics,omitempty"`
	Wall      time.Duration `json:"wall_ns"`
	Error     string        `json:"error,omitempty"`
}

// LifecycleBurst is the demo's k6 burst (flashsale.js) against instances
// with the lifecycle on: HoldTTL long enough that no hold lapses during the
// burst and PER_USER_LIMIT=1, every buyer a different user_id.
type LifecycleBurst struct {
	SKU          string        `json:"sku"`
	Stock        int64         `json:"stock"`
	Buyers       int           `json:"buyers"`
	VUs          int           `json:"vus"`
	HoldTTL      time.Duration `json:"hold_ttl_ns"`
	Orders       int64         `json:"orders"`
	SoldOut      int64         `json:"sold_out"`
	Busy         int64         `json:"busy"`
	Errors       int64         `json:"errors"`
	OrdersPerSec float64       `json:"orders_per_sec"`
	P99          time.Duration `json:"p99_ns"`
	ExitCode     int           `json:"exit_code"`
	Audit        *Audit        `json:"audit,omitempty"`
	Dir          string        `json:"dir,omitempty"`
	Dashboard    string        `json:"dashboard,omitempty"`
	Command      string        `json:"command,omitempty"`
	Error        string        `json:"error,omitempty"`
}

// SetBursts records the pairs of bursts, on and off: one pair as Burst and
// BurstOff, several as the rounds, with the median rate of each side (of an
// even count, the lower) as Burst and BurstOff.
func (l *Lifecycle) SetBursts(on, off []*LifecycleBurst) {
	l.Burst, l.BurstOff, l.BurstRounds, l.BurstOffRounds = medianBurst(on), medianBurst(off), nil, nil
	if len(on) > 1 || len(off) > 1 {
		l.BurstRounds, l.BurstOffRounds = on, off
	}
}

// medianBurst is the burst with the median rate among those that ran
// without an error, or the first when none did.
func medianBurst(bs []*LifecycleBurst) *LifecycleBurst {
	var ok []*LifecycleBurst
	for _, b := range bs {
		if b != nil && b.Error == "" && b.OrdersPerSec > 0 {
			ok = append(ok, b)
		}
	}
	if len(ok) == 0 {
		if len(bs) == 0 {
			return nil
		}
		return bs[0]
	}
	slices.SortStableFunc(ok, func(a, b *LifecycleBurst) int { return cmp.Compare(a.OrdersPerSec, b.OrdersPerSec) })
	return ok[(len(ok)-1)/2]
}

// bursts are every burst of the run, on then off, each once.
func (l *Lifecycle) bursts() (on, off []*LifecycleBurst) {
	on, off = l.BurstRounds, l.BurstOffRounds
	if len(on) == 0 && l.Burst != nil {
		on = []*LifecycleBurst{l.Burst}
	}
	if len(off) == 0 && l.BurstOff != nil {
		off = []*LifecycleBurst{l.BurstOff}
	}
	return on, off
}

// LifecycleGoal is the least the burst with the lifecycle on should keep of
// the same burst without it.
const LifecycleGoal = 0.8

// OrderTimes is one order row of a sale, as the resale delays need it:
// its state, when it was created, when its hold lapses and when it left
// held (zero when it has not).
type OrderTimes struct {
	State   string
	Created time.Time
	Expires time.Time
	Settled time.Time
}

// Resale is how soon the units that came back were sold again, measured on
// the database's order rows and its clock. Each returned unit (a cancelled
// or expired order, in the order they were settled) is matched to the
// first order created at or after its settled_at and not matched to an
// earlier return: the units are alike, so the k-th unit back is taken by
// the k-th order after it. An order's created_at is when its transaction
// began (PostgreSQL's now(); MariaDB's statement time), so an order that
// waited on the row lock across the return is counted at its start and
// passed over for a later one: the figures are close, not exact.
type Resale struct {
	// Expired counts the expired orders whose unit was taken again;
	// ExpiryP50/Max run from the hold's lapse (expires_at) to the order
	// that took the unit, SweepP50/Max from the lapse to the sweep
	// (settled_at): the part of the wait that is the sweep's period.
	Expired   int           `json:"expired"`
	ExpiryP50 time.Duration `json:"expiry_p50_ns"`
	ExpiryMax time.Duration `json:"expiry_max_ns"`
	SweepP50  time.Duration `json:"sweep_p50_ns"`
	SweepMax  time.Duration `json:"sweep_max_ns"`
	// Cancelled counts the cancelled orders whose unit was taken again,
	// CancelP50 the median from the cancel to the next order.
	Cancelled int           `json:"cancelled"`
	CancelP50 time.Duration `json:"cancel_p50_ns"`
	// NotResold counts the returns no later order took.
	NotResold int `json:"not_resold"`
}

// ResaleOf matches every return to the order that took its unit again (see
// Resale) and returns the delays.
func ResaleOf(rows []OrderTimes) *Resale {
	var returns []OrderTimes
	var takes []time.Time
	for _, o := range rows {
		takes = append(takes, o.Created)
		if (o.State == "cancelled" || o.State == "expired") && !o.Settled.IsZero() {
			returns = append(returns, o)
		}
	}
	slices.SortStableFunc(returns, func(a, b OrderTimes) int { return a.Settled.Compare(b.Settled) })
	slices.SortFunc(takes, func(a, b time.Time) int { return a.Compare(b) })
	res := &Resale{}
	var expiry, sweep, cancel []time.Duration
	j := 0
	for _, r := range returns {
		for j < len(takes) && takes[j].Before(r.Settled) {
			j++
		}
		if j == len(takes) {
			res.NotResold++
			continue
		}
		taken := takes[j]
		j++
		switch r.State {
		case "expired":
			res.Expired++
			expiry = append(expiry, taken.Sub(r.Expires))
			sweep = append(sweep, r.Settled.Sub(r.Expires))
		case "cancelled":
			res.Cancelled++
			cancel = append(cancel, taken.Sub(r.Settled))
		}
	}
	res.ExpiryP50, res.ExpiryMax = median(expiry), slicesMax(expiry)
	res.SweepP50, res.SweepMax = median(sweep), slicesMax(sweep)
	res.CancelP50 = median(cancel)
	return res
}

// median is the middle value (of an even count, the lower), 0 for none.
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

func slicesMax(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

// Resold is the returned units that were taken again: of the units that
// came back, those no longer on sale at the end (the units are alike, so
// the stock left over is counted against the returns).
func (l *Lifecycle) Resold() int64 {
	if l.Audit == nil {
		return 0
	}
	return max(l.Audit.Returned-l.Audit.Available, 0)
}

// Judge returns the lifecycle's verdict. A safe strategy passes when the
// audit is consistent, nothing is oversold, no buyer holds more than the
// limit, no two orders of one buyer were both accepted, and every unit was
// paid for; an unsupported strategy is neither. The burst's ratio is shown,
// not judged: one burst on a shared machine is too noisy to fail a run.
func (l *Lifecycle) Judge() Verdict {
	if l.Unsupported != "" {
		return Verdict{Status: StatusUnsupported}
	}
	var v Verdict
	var broken, violations []string
	switch {
	case l.Error != "":
		broken = append(broken, "run failed: "+l.Error)
	case l.Audit == nil:
		broken = append(broken, "no audit")
	}
	if a := l.Audit; a != nil {
		units := a.Initial + a.Restocked
		v.Oversold = max(a.Held+a.Paid-units, -a.Available, 0)
		v.Conserved = a.Consistent
		if v.Oversold > 0 {
			violations = append(violations, fmt.Sprintf("oversold %d units", v.Oversold))
		}
		if !a.Consistent && v.Oversold == 0 {
			violations = append(violations, fmt.Sprintf("the audit is not consistent: initial %d + restocked %d ≠ available %d + held %d + paid %d",
				a.Initial, a.Restocked, a.Available, a.Held, a.Paid))
		}
		if l.Error == "" && a.Paid < units && v.Oversold == 0 {
			broken = append(broken, fmt.Sprintf("%s of %s units paid within %s", fmtInt(a.Paid), fmtInt(units), l.RunFor))
		}
	}
	type namedBurst struct {
		what  string
		burst *LifecycleBurst
	}
	var all []namedBurst
	on, off := l.bursts()
	for i, b := range on {
		all = append(all, namedBurst{"the burst with the lifecycle on" + pairSuffix(len(on), i), b})
	}
	for i, b := range off {
		all = append(all, namedBurst{"the burst without it" + pairSuffix(len(off), i), b})
	}
	for _, b := range all {
		if b.burst == nil {
			continue
		}
		if b.burst.Error != "" {
			broken = append(broken, b.what+": "+b.burst.Error)
		}
		if a := b.burst.Audit; a != nil {
			over := max(a.Ordered-a.Initial, -a.Available, 0)
			v.Oversold = max(v.Oversold, over)
			if over > 0 {
				violations = append(violations, fmt.Sprintf("%s oversold %d units", b.what, over))
			} else if !a.Consistent {
				violations = append(violations, "the audit of "+b.what+" is not consistent")
			}
		}
	}
	if g := l.GoShape; g != nil {
		b, viol, over := g.judge()
		broken, violations, v.Oversold = append(broken, b...), append(violations, viol...), max(v.Oversold, over)
	}
	if l.LimitBreached > 0 {
		violations = append(violations, fmt.Sprintf("%s accepted both orders of one buyer (PER_USER_LIMIT=%d)", plural(l.LimitBreached, "time the service", "times the service"), l.PerUserLimit))
	}
	if l.OverLimit > 0 {
		violations = append(violations, fmt.Sprintf("%s hold or paid more than %d units", plural(l.OverLimit, "buyer", "buyers"), l.PerUserLimit))
	}
	if l.ExitCode != 0 && l.ExitCode != 99 && l.Error == "" {
		broken = append(broken, fmt.Sprintf("k6 exited with status %d", l.ExitCode))
	}
	v.Problems = append(violations, broken...)
	if IsControl(l.Strategy) {
		switch {
		case v.Oversold > 0:
			v.Status = StatusControlOversold
		case l.Error != "" || l.Audit == nil:
			v.Status = StatusError
		default:
			v.Status = StatusControlHeld
		}
		return v
	}
	switch {
	case len(violations) > 0:
		v.Status = StatusFail
	case len(broken) > 0:
		v.Status = StatusError
	default:
		v.Status = StatusOK
	}
	return v
}

func pairSuffix(n, i int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(" (pair %d)", i+1)
}

// Lifecycles returns the lifecycle runs in table order.
func (r *Report) Lifecycles() []*Lifecycle {
	out := slices.Clone(r.LifecycleRuns)
	slices.SortStableFunc(out, func(a, b *Lifecycle) int {
		return cmp.Or(
			cmp.Compare(indexOr(r.Backends, a.Backend), indexOr(r.Backends, b.Backend)),
			cmp.Compare(indexOr(r.Strategies, a.Strategy), indexOr(r.Strategies, b.Strategy)),
		)
	})
	return out
}

// lifecycleRow is one row of the lifecycle table.
type lifecycleRow struct {
	Backend, Strategy                                 string
	Paid, LastPaid, Orders, Returned, Resold, Settled string
	ExpiryResale, Sweep, CancelResale                 string
	Limit, Audit, BurstOff, BurstOn, Ratio            string
	// GoShape is the Go client's one-instance on ÷ off (every buyer
	// answered), GoShapeDetail its rates and rounds.
	GoShape, GoShapeDetail                     string
	GoShapeLow                                 bool
	Status, StatusClass, Problems, Unsupported string
	// Pairs lists every pair's rates (on / off) when there were several.
	Pairs string
	// OffSource says where the burst without the lifecycle came from
	// when it is not the run's own (BurstOff).
	OffSource                               string
	Control, Bad, RatioLow, AuditBad, First bool
}

// lifecycleRows lines up every lifecycle run with the same strategy's
// burst without the lifecycle (the median round's k6 orders/s).
func lifecycleRows(r *Report, burst []Row) []lifecycleRow {
	burstOf := map[string]Row{}
	for _, row := range burst {
		burstOf[row.Run.Backend+" "+row.Run.Strategy] = row
	}
	var out []lifecycleRow
	runs := r.Lifecycles()
	for i, l := range runs {
		v := l.Judge()
		row := lifecycleRow{
			Backend: r.BackendLabel(l.Backend), Strategy: l.Strategy,
			Paid: "–", LastPaid: "–", Orders: "–", Returned: "–", Resold: "–", Settled: "–",
			ExpiryResale: "–", Sweep: "–", CancelResale: "–", Limit: "–", Audit: "–",
			BurstOff: "–", BurstOn: "–", Ratio: "–",
			Status: StatusText(v), StatusClass: string(v.Status), Problems: strings.Join(v.Problems, "; "),
			Control: IsControl(l.Strategy), Bad: v.Status == StatusFail || v.Status == StatusError,
			First: i == 0 || runs[i-1].Backend != l.Backend,
		}
		off := 0.0
		if b, ok := burstOf[l.Backend+" "+l.Strategy]; ok && b.Stats.OrdersPerSec > 0 {
			off, row.BurstOff = b.Stats.OrdersPerSec, fmtRate(b.Stats.OrdersPerSec)
			row.OffSource = "the main table's burst (median round)"
		}
		if b := l.BurstOff; b != nil && b.Error == "" && b.OrdersPerSec > 0 {
			off, row.BurstOff, row.OffSource = b.OrdersPerSec, fmtRate(b.OrdersPerSec), ""
		}
		if on, offs := l.bursts(); len(on) > 1 || len(offs) > 1 {
			var pairs []string
			for i := range max(len(on), len(offs)) {
				rate := func(bs []*LifecycleBurst) string {
					if i < len(bs) && bs[i] != nil {
						return fmtRate(bs[i].OrdersPerSec)
					}
					return "–"
				}
				pairs = append(pairs, rate(on)+" / "+rate(offs))
			}
			row.Pairs = strings.Join(pairs, " · ")
		}
		if l.Burst != nil && l.Burst.OrdersPerSec > 0 && off > 0 {
			// Two decimals, not fmtRatio's two significant digits:
			// beside a goal of 0.8, 0.96 and 1.04 must not both read 1×.
			ratio := l.Burst.OrdersPerSec / off
			row.Ratio, row.RatioLow = strconv.FormatFloat(ratio, 'f', 2, 64)+"×", ratio < LifecycleGoal
		}
		goShapeCell(&row, l.GoShape)
		if l.Unsupported != "" {
			// Nothing ran: no burst to set beside the main table's.
			row.Unsupported, row.BurstOff, row.OffSource = l.Unsupported, "–", ""
			out = append(out, row)
			continue
		}
		if l.Burst != nil && l.Burst.Error == "" {
			row.BurstOn = fmtRate(l.Burst.OrdersPerSec)
		} else if l.Burst != nil {
			row.BurstOn = "failed: " + l.Burst.Error
		}
		row.Orders = fmtInt(l.Orders)
		row.Settled = fmt.Sprintf("%s paid · %s cancelled · %s left to lapse", fmtInt(l.Paid), fmtInt(l.Cancelled), fmtInt(l.Abandoned))
		row.Limit = fmt.Sprintf("%s / %s", fmtInt(l.LimitReached), fmtInt(l.SecondOrders))
		if l.LimitBreached > 0 {
			row.Limit += fmt.Sprintf(", %s both accepted", fmtInt(l.LimitBreached))
		}
		if l.OverLimit > 0 {
			row.Limit += fmt.Sprintf(", %s over the limit", plural(l.OverLimit, "buyer", "buyers"))
		}
		if l.LastPaid > 0 {
			row.LastPaid = fmtSeconds(l.LastPaid)
		}
		if a := l.Audit; a != nil {
			row.Paid = fmtInt(a.Paid) + " / " + fmtInt(a.Initial+a.Restocked)
			row.Returned = fmt.Sprintf("%s (%s cancelled, %s expired)", fmtInt(a.Returned), fmtInt(a.Cancelled), fmtInt(a.Expired))
			row.Resold = fmtInt(l.Resold())
			row.Audit, row.AuditBad = "consistent", !a.Consistent
			if !a.Consistent {
				row.Audit = "NOT consistent"
			}
			if a.Held > 0 {
				row.Audit += fmt.Sprintf(", %s still held", fmtInt(a.Held))
			}
		}
		if s := l.Resale; s != nil {
			if s.Expired > 0 {
				row.ExpiryResale = fmt.Sprintf("%s (max %s, %d units)", fmtDur(s.ExpiryP50), fmtDur(s.ExpiryMax), s.Expired)
				row.Sweep = fmt.Sprintf("%s (max %s)", fmtDur(s.SweepP50), fmtDur(s.SweepMax))
			}
			if s.Cancelled > 0 {
				row.CancelResale = fmt.Sprintf("%s (%d units)", fmtDur(s.CancelP50), s.Cancelled)
			}
		}
		out = append(out, row)
	}
	return out
}

// lifecycleLoad describes the lifecycle scenario in one sentence, from the
// first run that ran.
func lifecycleLoad(r *Report) string {
	for _, l := range r.Lifecycles() {
		if l.Unsupported != "" {
			continue
		}
		s := fmt.Sprintf("%s units, %s buyers on %d VUs over %d instances with HOLD_TTL=%s, HOLD_SWEEP_EVERY=%s, PER_USER_LIMIT=%d (loadtest/lifecycle.js). Each buyer orders one unit; a winner pays (%d%%), or else cancels (%d%% of the others) or walks away and lets the hold lapse; %d%% of the buyers send their first order twice at once, on two instances, and one of the two must be refused 409 limit_reached; a buyer told sold_out clicks again after %d ms, until every unit is paid or %s have passed",
			fmtInt(l.Stock), fmtInt(int64(l.Buyers)), l.VUs, l.Instances, l.HoldTTL, l.SweepEvery, l.PerUserLimit,
			l.PayPercent, l.CancelPercent, l.TwicePercent, l.RetryPauseMs, l.RunFor)
		if b := l.Burst; b != nil {
			s += fmt.Sprintf(". The burst with the lifecycle on is the demo's burst (%s buyers for %s units, %d VUs, every buyer a different user_id) against instances with HOLD_TTL=%s and PER_USER_LIMIT=%d; the burst off is the same burst right after, on fresh instances without them",
				fmtInt(int64(b.Buyers)), fmtInt(b.Stock), b.VUs, b.HoldTTL, l.PerUserLimit)
		}
		return s
	}
	return ""
}

// lifecycleFindings are the report's lines on the lifecycle: the strategies
// whose burst kept less than LifecycleGoal with it on.
func lifecycleFindings(rows []lifecycleRow) []string {
	var low, goLow []string
	for _, row := range rows {
		if row.RatioLow {
			low = append(low, fmt.Sprintf("%s on %s (%s)", row.Strategy, row.Backend, row.Ratio))
		}
		if row.GoShapeLow {
			goLow = append(goLow, fmt.Sprintf("%s on %s (%s)", row.Strategy, row.Backend, row.GoShape))
		}
	}
	var out []string
	if len(low) > 0 {
		out = append(out, fmt.Sprintf("With the lifecycle on, the burst kept less than %s of its rate without it: %s.", fmtRatio(LifecycleGoal), strings.Join(low, ", ")))
	}
	if len(goLow) > 0 {
		out = append(out, fmt.Sprintf("With the lifecycle on, the Go client's one-instance burst kept less than %s of its rate without it (or did not run clean): %s.", fmtRatio(LifecycleGoal), strings.Join(goLow, ", ")))
	}
	return out
}
