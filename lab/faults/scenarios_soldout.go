package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/history"
)

// soldOutBound is the bound scenario 13's check assumes: the SOLD_OUT_TTL
// of its safe runs (the service's default).
const soldOutBound = sales.DefaultSoldOutTTL

// soldOutClockSlack is added to the bound for the instances' clocks: a mark
// is timed on the instance's monotonic clock, the answers on the load's.
const soldOutClockSlack = 50 * time.Millisecond

// soldOutControlTTL is the SOLD_OUT_TTL of the control run: far longer
// than the bound the check assumes, so that marks refuse units that came
// back long before, which the check must catch.
const soldOutControlTTL = 30 * time.Second

// soldOutStock is the units of each SKU of scenario 13: few, so that every
// SKU sells out at once and each unit given back is sold again.
const soldOutStock = 3

// soldOutHoldTTL is the holds' HOLD_TTL in scenario 13: longer than the
// run, so that units come back by cancels and restocks only, at times the
// load knows.
const soldOutHoldTTL = 10 * time.Minute

// SoldOutMark is scenario 13: the sold-out mark across instances while
// units come back. Three instances (STRATEGY=conditional or batched, HOLD_TTL=10m,
// SOLD_OUT_TTL=1s) and many SKUs of 3 units each. Per
// SKU, a buyer group loops: a wave of orders, one on each instance at
// once, until every instance is refused sold out (so each holds a mark);
// then one unit comes back through an instance R — a cancel of a held
// order placed on another instance, or a restock — while orders of one
// unit go on to the instances other than R, which must sell it within the
// bound. Midway one instance is frozen (SIGSTOP) for longer than the
// bound while units of SKUs it marked come back through the others; after
// SIGCONT its first orders of them must be sold. Then the rows are checked
// as scenario 11's (every 201 a row, no SKU sold past its stock and
// restocks, every answer true to the rows, each order's history), and
// each SKU's history against a stock counter in which a sold-out answer
// may rest on a state up to the bound before its call, and no earlier
// (soModel).
//
// With control, the instances run SOLD_OUT_TTL=30s, still checked against
// the 1s bound: the check must find sold-out answers no state within the
// bound explains, or the run fails (the check would have no teeth).
func (e *Env) SoldOutMark(ctx context.Context, engine, strategy string, control bool) Result {
	ttl, name := soldOutBound, fmt.Sprintf("13-sold-out-mark/%s/%s", engine, strategy)
	title := "the sold-out mark across instances while units come back (cancels through another instance, restocks), one instance frozen past the bound"
	if control {
		ttl = soldOutControlTTL
		name += "/ttl-" + ttl.String()
		title = fmt.Sprintf("control: SOLD_OUT_TTL=%s checked against a bound of %s — the check must catch the refusals past it", ttl, soldOutBound)
	}
	r := e.newRun(13, name, title, Config{Engine: engine, Strategy: strategy, Safe: !control, Instances: 3, OrderTimeout: "3s"})
	// No PER_USER_LIMIT: under a limit the mark is off (every order asks
	// the store, which answers a buyer at the limit first).
	if err := r.setUp(ctx, 0, "HOLD_TTL="+soldOutHoldTTL.String(), "SOLD_OUT_TTL="+ttl.String()); err != nil {
		return r.abort(err)
	}
	defer r.close()

	d := e.scale(20*time.Second, 7*time.Second)
	frozenFor := e.scale(3*time.Second, 2*time.Second)
	skus, faultSKUs := soSKUs("s13", e.scaleInt(60, 24)), soSKUs("s13-frozen", 8)
	c := &r.res.Config
	// The frozen instance's SKUs (one unit each) are in the notes.
	c.StockPerSKU, c.SKUs = soldOutStock, len(skus)
	if err := r.startSales(ctx, skus, soldOutStock); err != nil {
		return r.abort(err)
	}
	// The frozen instance's SKUs: one unit each, sold, marked on it, and
	// given back while it is frozen.
	if err := r.startSales(ctx, faultSKUs, 1); err != nil {
		return r.abort(err)
	}
	r.res.Lifecycle = &LifecycleFigures{HoldTTL: soldOutHoldTTL.String(), CaughtIn: -1}
	l := startSoldOutLoad(ctx, r.cluster, skus, 3*d)
	c.Workers, c.ClientTimeout = len(skus), l.views[0].spec.timeout.String()
	event := r.eventLog(l.now)

	pause(ctx, d/3)
	victim := rand.IntN(len(r.cluster.Instances))
	fz, err := l.freeze(ctx, victim, faultSKUs, frozenFor, event)
	if err != nil {
		l.stopAndWait()
		return r.abort(err)
	}
	pause(ctx, d/2)
	l.stopAndWait()
	end := l.now()
	c.LoadSeconds = seconds(end)

	// The rows, then the audits, then the rows again: the same, or the
	// service was still finishing requests, and all is read again.
	all := append(slices.Clone(skus), faultSKUs...)
	var tables *lcTables
	var audits map[string]lcAudit
	var readAt time.Duration
	changes := 0
	for try := 1; ; try++ {
		var n int
		var err error
		if tables, n, err = settledRows(ctx, r.dbURL, 15*time.Second); err != nil {
			return r.abort(fmt.Errorf("read the rows: %w", err))
		}
		changes += n
		readAt = l.now()
		if audits, err = readAudits[lcAudit](ctx, r, all); err != nil {
			return r.abort(err)
		}
		again, err := readLifecycle(ctx, r.dbURL)
		if err != nil {
			return r.abort(fmt.Errorf("read the rows: %w", err))
		}
		if sameTables(tables, again) {
			break
		}
		changes++
		if try == 3 {
			return r.abort(fmt.Errorf("the rows changed while the audits were read, three times"))
		}
	}
	if changes > 0 {
		r.note("the rows changed %d times after the load ended (requests whose clients had given up, finished by the service later); "+
			"read at %.2fs, %.2fs after its end", changes, seconds(readAt), seconds(readAt-end))
	}
	ops := l.snapshot()
	c.Rate = float64(countFunc(ops, func(op lcOp) bool { return op.Kind == lcOrder })) / end.Seconds()
	tables.unlimited = true
	r.checkLifecycle(ops, l.views[0], tables, audits, readAt)
	otherFailures := len(r.res.Failures)
	illegal := r.checkSoldOutHistories(ops, l.restockOps(), all)
	r.soldOutAvailability(ops, l, fz, end)

	r.res.Phases = []Phase{
		{Name: "before the freeze", FromS: 0, ToS: seconds(fz.frozenAt), Figures: lcFigures(ops, 0, fz.frozenAt)},
		{Name: fmt.Sprintf("instance %d frozen", victim), FromS: seconds(fz.frozenAt), ToS: seconds(fz.resumedAt), Figures: lcFigures(ops, fz.frozenAt, fz.resumedAt)},
		{Name: "after SIGCONT", FromS: seconds(fz.resumedAt), ToS: seconds(end), Figures: lcFigures(ops, fz.resumedAt, end+time.Hour)},
	}
	f := lcFigures(ops, 0, end+time.Hour)
	f.OrderRows, f.UnitsSold = len(tables.orders), r.res.Lifecycle.PaidUnits
	for _, row := range tables.orders {
		if row.State == inventory.OrderHeld {
			f.UnitsSold += row.Quantity
		}
	}
	f.OversoldUnits, f.LostOrders, f.PhantomOrders = r.res.Figures.OversoldUnits, r.res.Figures.LostOrders, r.res.Figures.PhantomOrders
	f.UnseenOrders = r.res.Figures.UnseenOrders
	r.res.Figures = f
	if !control {
		return r.conclude()
	}
	// The control demonstrates the check: it must be caught, and by the
	// relaxed history alone (the mark only refuses, so a row check that
	// fails here is a fault of the service, not of the control).
	if illegal == 0 {
		r.fail("the control was not caught: no sold-out answer past the %s bound was found illegal with SOLD_OUT_TTL=%s", soldOutBound, ttl)
	}
	res := r.conclude()
	if illegal == 0 || otherFailures > 0 {
		r.res.Verdict = VerdictFailed
		r.res.Line = r.res.verdictLine()
		e.logf("%s (the control: %d SKUs caught, %d failures of the other checks)", r.res.Line, illegal, otherFailures)
		res = r.res
	}
	return res
}

func (e *Env) scaleInt(full, short int) int {
	if e.Short {
		return short
	}
	return full
}

// soSKUs names n SKUs prefix-000, prefix-001...
func soSKUs(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return s
}

// soRestock is one restock of the load, on the load's clock; Outcome is
// history.OK (answered 200) or history.Unknown (any other answer, or
// none: it may have been made).
type soRestock struct {
	SKU       string
	Instance  int
	Units     int64
	Call, Ret time.Duration
	Outcome   history.Outcome
}

// soCycle is one return of a SKU and what became of it: when the unit
// came back (the give's answer), when the first order after it was sold,
// and the refusals in between.
type soCycle struct {
	SKU         string
	Give        string // "cancel" or "restock"
	GiveRet     time.Duration
	Sold        bool
	SoldRet     time.Duration
	RefusedOnly int
}

// soLoad is scenario 13's load: one buyer group per SKU, each request sent
// to an instance of its choosing and recorded.
type soLoad struct {
	cluster *Cluster
	// views[i] sends to instance i: lifecycle loads without buyers of
	// their own, sharing one clock, so that their requests are one
	// history.
	views   []*lcLoad
	start   time.Time
	stopped context.Context
	stop    context.CancelFunc
	done    chan struct{}
	// frozen is 1 + the index of the instance frozen now (0: none): the
	// buyers leave it alone, as a balancer's health check would.
	frozen atomic.Int32

	mu       sync.Mutex
	restocks []soRestock
	cycles   []soCycle
}

// soProbeFor is how long a buyer group offers a unit given back to the
// instances other than the one it came back through: past the bound, so
// that a mark held too long refuses it past the bound.
const soProbeFor = 2500 * time.Millisecond

func startSoldOutLoad(ctx context.Context, cluster *Cluster, skus []string, limit time.Duration) *soLoad {
	start := time.Now()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4*len(skus) + 16, IdleConnTimeout: 30 * time.Second}}
	l := &soLoad{cluster: cluster, start: start, done: make(chan struct{})}
	prefix := "b" + randomHex(3)
	for _, in := range cluster.Instances {
		l.views = append(l.views, &lcLoad{spec: lcSpec{timeout: 5 * time.Second}, targets: []*Instance{in}, client: client,
			prefix: prefix, start: start, wallStart: start})
	}
	l.stopped, l.stop = context.WithTimeout(ctx, limit)
	var wg sync.WaitGroup
	for w, sku := range skus {
		wg.Go(func() { l.group(ctx, w, sku, prefix) })
	}
	go func() {
		wg.Wait()
		close(l.done)
	}()
	return l
}

func (l *soLoad) now() time.Duration { return time.Since(l.start) }

func (l *soLoad) stopAndWait() {
	l.stop()
	<-l.done
}

// live returns the instances not frozen, but except.
func (l *soLoad) live(except int) []int {
	var out []int
	frozen := int(l.frozen.Load()) - 1
	for i := range l.views {
		if i != except && i != frozen {
			out = append(out, i)
		}
	}
	return out
}

// heldOrder is an order answered 201, and the instance that placed it.
type heldOrder struct {
	id, user string
	instance int
}

// group is one SKU's buyers: sell the SKU out on every instance, give a
// unit back through one, offer it to the others; again until the load
// stops.
func (l *soLoad) group(ctx context.Context, w int, sku, prefix string) {
	var held []heldOrder
	seq := 0
	order := func(i int) lcOp {
		seq++
		user := fmt.Sprintf("%s-%s-%d", prefix, sku, seq)
		op := l.views[i].do(ctx, w, lcOrder, sku, user, "")
		if op.Status == http.StatusCreated && op.OrderID != "" {
			held = append(held, heldOrder{id: op.OrderID, user: user, instance: i})
		}
		return op
	}
	for l.stopped.Err() == nil {
		// Sell out: waves of orders, one on each live instance at once,
		// until a wave is refused sold out on every one (each then
		// holds a mark, or was told by the store).
		for range 8 {
			targets := l.live(-1)
			answers := make([]lcOp, len(targets))
			users := make([]string, len(targets))
			var wg sync.WaitGroup
			for k, i := range targets {
				seq++
				users[k] = fmt.Sprintf("%s-%s-%d", prefix, sku, seq)
				wg.Go(func() { answers[k] = l.views[i].do(ctx, w, lcOrder, sku, users[k], "") })
			}
			wg.Wait()
			refused := 0
			for k, op := range answers {
				if op.Status == http.StatusCreated && op.OrderID != "" {
					held = append(held, heldOrder{id: op.OrderID, user: users[k], instance: targets[k]})
				}
				if op.Code == "sold_out" {
					refused++
				}
			}
			if refused == len(answers) || l.stopped.Err() != nil {
				break
			}
		}
		if l.stopped.Err() != nil {
			return
		}
		// One unit back through an instance R, a cancel of an order
		// another instance placed (R's mark goes, the others' stay) or
		// a restock, while the others are offered it.
		live := l.live(-1)
		via := live[rand.IntN(len(live))]
		cy := soCycle{SKU: sku}
		gave := make(chan time.Duration, 1)
		if k := slices.IndexFunc(held, func(h heldOrder) bool { return h.instance != via }); k >= 0 && rand.Float64() < 0.6 {
			h := held[k]
			held = slices.Delete(held, k, k+1)
			cy.Give = lcCancel
			go func() {
				op := l.views[via].do(ctx, w, lcCancel, sku, h.user, h.id)
				gave <- op.Ret
			}()
		} else {
			cy.Give = "restock"
			go func() {
				ret, _ := l.restock(ctx, sku, via)
				gave <- ret
			}()
		}
		others := l.live(via)
		deadline := l.now() + soProbeFor
		var lastRet time.Duration
		for k := 0; len(others) > 0 && l.now() < deadline && l.stopped.Err() == nil; k++ {
			op := order(others[k%len(others)])
			lastRet = op.Ret
			if op.Status == http.StatusCreated {
				cy.Sold, cy.SoldRet = true, op.Ret
				break
			}
			if op.Code == "sold_out" {
				cy.RefusedOnly++
			}
			pause(l.stopped, time.Duration(100+rand.IntN(50))*time.Millisecond)
		}
		cy.GiveRet = <-gave
		if !cy.Sold {
			cy.SoldRet = lastRet
		}
		if !cy.Sold && l.stopped.Err() != nil {
			return // cut short by the end of the load: not a cycle
		}
		l.mu.Lock()
		l.cycles = append(l.cycles, cy)
		l.mu.Unlock()
	}
}

// restock adds one unit of sku through instance via, once (no retry on
// another instance: the history must know who did it), and returns when
// it was answered and whether it was answered 200.
func (l *soLoad) restock(ctx context.Context, sku string, via int) (time.Duration, bool) {
	rs := soRestock{SKU: sku, Instance: via, Units: 1, Call: l.now(), Outcome: history.OK}
	err := l.cluster.adminOnce(ctx, l.cluster.Instances[via], http.MethodPost, "/admin/stock/"+sku+"/restock", `{"quantity":1}`, nil)
	rs.Ret = l.now()
	if err != nil {
		// A refusal or no answer: it may have been made.
		rs.Outcome = history.Unknown
	}
	l.mu.Lock()
	l.restocks = append(l.restocks, rs)
	l.mu.Unlock()
	return rs.Ret, err == nil
}

// snapshot returns every request of the load, by call time, each with the
// instance it went to.
func (l *soLoad) snapshot() []lcOp {
	var ops []lcOp
	for i, v := range l.views {
		for _, op := range v.snapshot() {
			op.Instance = i
			ops = append(ops, op)
		}
	}
	sort.SliceStable(ops, func(a, b int) bool { return ops[a].Call < ops[b].Call })
	return ops
}

func (l *soLoad) restockOps() []soRestock {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.restocks)
}

// soFreeze is what the freeze did: when, to whom, and what the frozen
// instance answered after SIGCONT for the units that came back meanwhile.
type soFreeze struct {
	victim, skus        int
	frozenAt, resumedAt time.Duration
	returned            int // units of the frozen SKUs given back while it was frozen
	soldAfter           int // of them, sold by the frozen instance's first order after SIGCONT
	refusedAfter        []string
	skipped             []string // SKUs left out, and why
}

// freeze is the fault: each of skus (one unit each) is sold through
// another instance and then refused on victim, which marks it there;
// victim is frozen (SIGSTOP) for frozenFor, longer than the bound, while
// each unit comes back through the others (a cancel through an instance
// other than the one that placed it, or a restock); then SIGCONT, and an
// order of each through victim, which its mark must not refuse: the mark
// runs on the monotonic clock, which a pause does not stop.
func (l *soLoad) freeze(ctx context.Context, victim int, skus []string, frozenFor time.Duration,
	event func(string, ...any) time.Duration) (*soFreeze, error) {
	placer, canceller := (victim+1)%len(l.views), (victim+2)%len(l.views)
	const worker = 9000
	// A SKU whose unit was not sold, or that victim did not refuse, is
	// left out (a 503 under load): it would test nothing.
	var marked []string
	ids := map[string]heldOrder{}
	var skipped []string
	for k, sku := range skus {
		user := fmt.Sprintf("frozen-%s-%d", sku, k)
		op := l.views[placer].do(ctx, worker, lcOrder, sku, user, "")
		if op.Status != http.StatusCreated {
			skipped = append(skipped, fmt.Sprintf("%s sold through instance %d: %d %s %s", sku, placer, op.Status, op.Code, op.Err))
			continue
		}
		ids[sku] = heldOrder{id: op.OrderID, user: user, instance: placer}
		if op := l.views[victim].do(ctx, worker, lcOrder, sku, user+"-x", ""); op.Code != "sold_out" {
			skipped = append(skipped, fmt.Sprintf("%s refused on instance %d: %d %s %s", sku, victim, op.Status, op.Code, op.Err))
			continue
		}
		marked = append(marked, sku)
	}
	if len(marked) == 0 {
		return nil, fmt.Errorf("no SKU could be sold out and marked on instance %d: %s", victim, sample(skipped))
	}
	fz := &soFreeze{victim: victim, skus: len(marked), skipped: skipped}
	skus = marked
	l.frozen.Store(int32(victim + 1))
	if err := l.cluster.Instances[victim].Pause(); err != nil {
		l.frozen.Store(0)
		return nil, err
	}
	fz.frozenAt = event("SIGSTOP instance %d, which marked %d SKUs sold out", victim, len(skus))
	for k, sku := range skus {
		if k%2 == 0 {
			h := ids[sku]
			if op := l.views[canceller].do(ctx, worker, lcCancel, sku, h.user, h.id); op.Status == http.StatusOK {
				fz.returned++
			}
		} else if _, ok := l.restock(ctx, sku, placer); ok {
			fz.returned++
		}
	}
	event("%d of their units given back through instances %d and %d (cancels through another instance than the one that placed the order, and restocks)",
		fz.returned, placer, canceller)
	pause(ctx, frozenFor) // the mark's expiry through the freeze is what is under test
	err := l.cluster.Instances[victim].Resume()
	fz.resumedAt = event("SIGCONT instance %d after %s", victim, frozenFor)
	if err != nil {
		return nil, err
	}
	for k, sku := range skus {
		op := l.views[victim].do(ctx, worker, lcOrder, sku, fmt.Sprintf("frozen-%s-after-%d", sku, k), "")
		if op.Status == http.StatusCreated {
			fz.soldAfter++
		} else {
			fz.refusedAfter = append(fz.refusedAfter, fmt.Sprintf("%s: %d %s", sku, op.Status, op.Code))
		}
	}
	l.frozen.Store(0)
	event("instance %d sold %d of the %d units given back while it was frozen", victim, fz.soldAfter, len(skus))
	return fz, nil
}
