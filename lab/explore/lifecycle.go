package explore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/lab/history"
)

// Lifecycle is an exploration of the order lifecycle: orders placed and
// held through the strategy under test before the schedule's choices
// begin, then actors that pay, cancel or look them up, sweep lapsed holds
// or buy, while the scheduler picks the step at which each hold that may
// lapse does. The rule on trial: a unit comes back only in the transaction
// that moved its order out of held, and an order leaves held once.
type Lifecycle struct {
	Name  string
	Stock int64
	Holds []Hold
	// Actors run at once, one entity each, named A, B, … in this order.
	Actors   []Actor
	Strategy func(Env) inventory.Strategic
	Faults   Faults
	// PerUserLimit is every instance's PER_USER_LIMIT (0: none).
	PerUserLimit int64
	// MaxSchedules, Samples and Seed are as in Scenario.
	MaxSchedules int
	Samples      int
	Seed         uint64
	// Reserved names the Explorer's reservation store the strategy takes
	// orders into (as in Scenario): the holds are written to the database
	// before the schedule, a writer entity writes the buyers' orders a
	// batch a step, and at the end the store's books are held to the
	// database's once every return is relayed. "" for the strategies that
	// write the database themselves.
	Reserved string
	// RetryUnreplayed is how often a schedule that the server did not
	// replay is run again before it is counted (Report.Unreplayed) and
	// the untried choices where it diverged are left out; 0: it is an
	// error, as in Explore. MariaDB (10.11) needs it: a locking read with
	// SKIP LOCKED sometimes waits for a row another transaction holds
	// instead of skipping it, which no schedule decides.
	RetryUnreplayed int
	// SoldOutBound adds an entity at whose step ("sold-out mark's bound
	// passes") the instances' clock moves past SOLD_OUT_TTL, so that a
	// sold-out mark set before it refuses no more. Without it the clock
	// stands still and a mark refuses to the end of the schedule.
	SoldOutBound bool
	// MarkOutlivesBound is the control of the sold-out mark's bound: the
	// bound's step leaves the clock where it is, so that a mark refuses
	// past it, as one that never expired would.
	MarkOutlivesBound bool
}

// soldOutTTL is the instances' SOLD_OUT_TTL in a lifecycle schedule; only
// the bound's step moves their clock, by more than it.
const soldOutTTL = time.Second

// stepClock is the instances' clock for the sold-out mark: it moves a
// nanosecond a reading, so that readings are ordered as the code takes
// them (a refusal sent after a clear reads a later time than the clear),
// and by a bound's worth only at the bound's step. A schedule's readings
// come in the order its steps do, so it replays the same.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func newStepClock() *stepClock { return &stepClock{t: time.Unix(1_000_000, 0)} }

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Nanosecond)
	return c.t
}

func (c *stepClock) pass(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Hold is an order placed before the schedule begins, held for a day:
// long enough that only the scheduler lapses it.
type Hold struct {
	Quantity int64
	Lapse    Lapse
}

// Lapse says when a hold lapses.
type Lapse int

const (
	// NeverLapses: not during the schedule.
	NeverLapses Lapse = iota
	// LapsedBefore: before the schedule's first step.
	LapsedBefore
	// LapsesInSchedule: at a step the scheduler picks ("hold 1: lapses"),
	// possibly after every actor is done.
	LapsesInSchedule
)

// Act is what an actor does.
type Act int

const (
	// Pay pays its hold (Service.PayOrder).
	Pay Act = iota + 1
	// Cancel cancels its hold (Service.CancelOrder).
	Cancel
	// Look reads its hold (Service.FindOrder), which expires a lapsed one
	// on the spot.
	Look
	// Sweep expires lapsed holds (Service.ExpireHolds).
	Sweep
	// Buy places an order of Quantity (Service.PlaceOrder).
	Buy
)

func (a Act) String() string {
	switch a {
	case Pay:
		return "pays"
	case Cancel:
		return "cancels"
	case Look:
		return "looks up"
	case Sweep:
		return "sweeps"
	case Buy:
		return "buys"
	}
	return fmt.Sprintf("act %d", int(a))
}

// Actor is one thread of the lifecycle scenario.
type Actor struct {
	Act Act
	// Hold is the index in Lifecycle.Holds of the order it pays, cancels
	// or looks up.
	Hold int
	// Quantity is what it buys.
	Quantity int64
	// Batch is how many holds one of its sweep transactions expires (0:
	// sales.DefaultSweepBatch).
	Batch int
	// Instance is the instance of the service it calls: instances share
	// the database and the lock, as two processes behind one load
	// balancer do, and nothing else.
	Instance int
	// User is the buyer's user_id for Buy; "" for one of its own.
	User string
	// Retry, for Buy: once refused sold out, the buyer buys again (a
	// click after the answer): its second call starts after its first
	// answer, so the sold-out mark its first refusal set may answer it.
	Retry bool
}

// holdTTL is how long every order of a lifecycle schedule is held: long
// enough that only the scheduler lapses it, and that no hold an earlier
// schedule left lapses during a long exploration (EXPLORE_SCALE) for a
// later schedule's sweep to take.
const holdTTL = 24 * time.Hour

// setupBuyer numbers the entities that place the holds before the
// schedule, apart from the actors (0, 1, …) in the scheduler's books.
const setupBuyer = 100

// lifecycleAnswer is what an actor's call returned.
type lifecycleAnswer struct {
	order inventory.Order
	swept int
	err   error
	// first is the refusal of a buyer's first attempt when it bought
	// again (Actor.Retry), at firstAt: the trace's length when it was
	// answered, which is also when the second attempt was sent.
	first   error
	firstAt int64
}

// said is the state of its order an answer names: the order's state on
// success, the state a refusal reports (ErrOrderExpired: expired), or ""
// for an answer that names none (busy, unavailable, a sweep, a buy).
func (a lifecycleAnswer) said(act Act) string {
	if act != Pay && act != Cancel && act != Look {
		return ""
	}
	if a.err == nil {
		return a.order.State
	}
	for _, s := range []struct {
		err   error
		state string
	}{
		{inventory.ErrOrderPaid, inventory.OrderPaid},
		{inventory.ErrOrderCancelled, inventory.OrderCancelled},
		{inventory.ErrOrderExpired, inventory.OrderExpired},
		{inventory.ErrOrderFinal, inventory.OrderFinal},
	} {
		if errors.Is(a.err, s.err) {
			return s.state
		}
	}
	return ""
}

// outcome names the answer as a report shows it: the state an answer
// names, "swept N", or inventory.Outcome.
func (a lifecycleAnswer) outcome(act Act) string {
	switch {
	case a.said(act) != "":
		return a.said(act)
	case act == Sweep && a.err == nil:
		return fmt.Sprintf("swept %d", a.swept)
	}
	return inventory.Outcome(a.err)
}

// ExploreLifecycle runs the lifecycle scenario's schedules and reports
// what broke, as Explore does.
func (x *Explorer) ExploreLifecycle(ctx context.Context, lc Lifecycle) (Report, error) {
	return walk(ctx, lc.Name, lc.MaxSchedules, lc.Samples, lc.Seed, lc.RetryUnreplayed, func(pick picker) (result, error) {
		return x.runLifecycle(ctx, lc, pick)
	})
}

// ReplayLifecycle runs one schedule of the lifecycle scenario, as Replay
// does. The outcomes are the state each answer names ("paid", "expired"),
// "swept N" for a sweep, or inventory.Outcome's name.
func (x *Explorer) ReplayLifecycle(ctx context.Context, lc Lifecycle, prefix []string) (Run, error) {
	return replay(prefix, func(pick picker) (result, error) { return x.runLifecycle(ctx, lc, pick) })
}

// runLifecycle runs one schedule of lc, asking pick at each choice point,
// and checks it.
func (x *Explorer) runLifecycle(ctx context.Context, lc Lifecycle, pick picker) (result, error) {
	lapses := false
	for _, h := range lc.Holds {
		lapses = lapses || h.Lapse != NeverLapses
	}
	if lapses && x.clock == nil {
		return result{}, errors.New("explore: the scenario's holds lapse, but the explorer has no clock (WithClock)")
	}
	x.runs++
	sku := fmt.Sprintf("%s%d", x.prefix, x.runs)
	s := newScheduler(x.blocked, lc.Faults)
	st := newStore(x.store, s)
	env := Env{Locker: &locker{s: s}, Store: st, Queue: queue{s}}
	var (
		reserved *reservations
		write    func(context.Context, string) (int, error)
	)
	if lc.Reserved != "" {
		r, ok := x.res[lc.Reserved]
		if !ok {
			return result{}, fmt.Errorf("explore: no reservation store %q (WithReservations)", lc.Reserved)
		}
		// No writer yet: the holds are written before the schedule.
		reserved, write = &reservations{Reservations: r.Store, st: st}, r.Write
		env.Reservations, env.Sales = reserved, r.Sales
	}
	instances := 1
	for _, a := range lc.Actors {
		instances = max(instances, a.Instance+1)
	}
	services := make([]*sales.Service, instances)
	strategies := make([]inventory.Strategy, instances)
	clock := newStepClock()
	for i := range services {
		strategies[i] = lc.Strategy(env).Strategy()
		services[i] = sales.NewService(st, strategies[i],
			// The scheduler decides what happens when; no deadline may,
			// and no hold lapses, nor a sold-out mark's bound passes, but
			// by the scheduler's choice.
			sales.WithOrderTimeout(time.Minute),
			sales.WithClock(clock.now), sales.WithSoldOutTTL(soldOutTTL),
			sales.WithHoldTTL(holdTTL), sales.WithPerUserLimit(lc.PerUserLimit),
			sales.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	}
	if err := services[0].StartSale(ctx, sku, lc.Stock); err != nil {
		return result{}, err
	}

	// The holds are placed one after the other through the strategy, its
	// steps always the plain next one: they are the scenario's starting
	// point, not part of its schedule.
	holds := make([]inventory.Order, len(lc.Holds))
	for i, h := range lc.Holds {
		e := s.newEntity(fmt.Sprintf("placing hold %d", i+1), setupBuyer+i)
		req := inventory.Request{SKU: sku, Quantity: h.Quantity, UserID: fmt.Sprintf("holder-%d", i+1)}
		var placeErr error
		go func() {
			holds[i], placeErr = services[0].PlaceOrder(withEntity(ctx, e), req)
			s.events <- event{e: e, kind: evDone}
		}()
		if _, err := s.drive(ctx, func(int, []choice) (int, error) { return 0, nil }, nil); err != nil {
			return result{}, fmt.Errorf("explore: place hold %d: %w", i+1, err)
		}
		if placeErr != nil {
			return result{}, fmt.Errorf("explore: place hold %d: %w", i+1, placeErr)
		}
		if holds[i].State != inventory.OrderHeld {
			return result{}, fmt.Errorf("explore: hold %d was placed %q, not held: the strategy does not take holds", i+1, holds[i].State)
		}
		if reserved != nil {
			// In the database before it can lapse there.
			if err := writeAll(ctx, write, sku, 1); err != nil {
				return result{}, err
			}
		}
		if h.Lapse == LapsedBefore {
			if err := x.clock.Lapse(ctx, holds[i].ID); err != nil {
				return result{}, err
			}
		}
	}
	var w *writer
	if reserved != nil {
		buyers := 0
		for _, a := range lc.Actors {
			if a.Act == Buy {
				buyers++
			}
		}
		w = newWriter(s, write, buyers)
		reserved.w = w
	}
	s.trace = nil

	answers := make([]lifecycleAnswer, len(lc.Actors))
	actors := make([]*entity, len(lc.Actors))
	for i, a := range lc.Actors {
		e := s.newEntity(string(rune('A'+i)), i)
		actors[i] = e
		svc := services[a.Instance]
		go func() {
			ectx := withEntity(ctx, e)
			var ans lifecycleAnswer
			switch a.Act {
			case Pay:
				ans.order, ans.err = svc.PayOrder(ectx, holds[a.Hold].ID, holds[a.Hold].UserID)
			case Cancel:
				ans.order, ans.err = svc.CancelOrder(ectx, holds[a.Hold].ID, holds[a.Hold].UserID)
			case Look:
				ans.order, ans.err = svc.FindOrder(ectx, holds[a.Hold].ID, holds[a.Hold].UserID)
			case Sweep:
				ans.swept, ans.err = svc.ExpireHolds(ectx, a.Batch)
			case Buy:
				user := a.User
				if user == "" {
					user = "buyer-" + e.name
				}
				req := inventory.Request{SKU: sku, Quantity: a.Quantity, UserID: user}
				ans.order, ans.err = svc.PlaceOrder(ectx, req)
				if a.Retry && errors.Is(ans.err, inventory.ErrSoldOut) {
					// Only this entity runs: the trace stands still.
					ans.first, ans.firstAt = ans.err, int64(len(s.trace))
					ans.order, ans.err = svc.PlaceOrder(ectx, req)
				}
				if w != nil {
					w.buyerDone()
				}
			default:
				ans.err = fmt.Errorf("explore: actor %s has no act", e.name)
			}
			answers[i] = ans
			s.events <- event{e: e, kind: evDone}
		}()
	}
	lapseErrs := make([]error, len(lc.Holds))
	for i, h := range lc.Holds {
		if h.Lapse != LapsesInSchedule {
			continue
		}
		e := s.newEntity(fmt.Sprintf("hold %d", i+1), -1)
		go func() {
			defer func() { s.events <- event{e: e, kind: evDone} }()
			if s.park(e, stepLapse, x.clock.session).abort {
				return
			}
			lapseErrs[i] = x.clock.Lapse(ctx, holds[i].ID)
		}()
	}
	boundAt := int64(-1) // the trace's length at the bound's step; -1: not passed
	if lc.SoldOutBound {
		e := s.newEntity("sold-out mark", -1)
		go func() {
			defer func() { s.events <- event{e: e, kind: evDone} }()
			if s.park(e, stepBound, 0).abort {
				return
			}
			boundAt = int64(len(s.trace))
			if !lc.MarkOutlivesBound {
				clock.pass(soldOutTTL + time.Millisecond)
			}
		}()
	}
	if w != nil {
		go w.run(ctx, sku)
	}
	returned, err := s.drive(ctx, pick, actors)
	if err != nil {
		return result{trace: s.trace}, errors.Join(err, sweepLeftovers(ctx, services[0]))
	}
	if err := errors.Join(lapseErrs...); err != nil {
		return result{trace: s.trace}, err
	}
	res := result{trace: s.trace}
	for i, a := range lc.Actors {
		res.outcomes = append(res.outcomes, answers[i].outcome(a.Act))
	}
	res.audit, res.problems = x.checkLifecycle(ctx, lc, sku, st, holds, answers, returned, boundAt, s)
	if w != nil {
		// Returns a failed relay left marked go back first (the sweep
		// would); then the store's books must be the database's.
		if relay := strategies[0].RelayReturns; relay != nil {
			if _, err := relay(ctx, sku); err != nil {
				res.problems = append(res.problems, fmt.Sprintf("relay the returns left marked: %v", err))
			}
		}
		res.problems = append(res.problems, x.checkReserved(ctx, services[0], sku, w)...)
	}
	return res, sweepLeftovers(ctx, services[0])
}

// writeAll writes the n orders placed into the reservation store before a
// schedule into the database, outside the schedule.
func writeAll(ctx context.Context, write func(context.Context, string) (int, error), sku string, n int) error {
	for written := 0; written < n; {
		m, err := write(ctx, sku)
		if err != nil {
			return fmt.Errorf("explore: write the holds: %w", err)
		}
		if m == 0 {
			return fmt.Errorf("explore: %d of %d holds written, and the writer finds no more", written, n)
		}
		written += m
	}
	return nil
}

// sweepLeftovers expires, outside any schedule, the holds a schedule left
// lapsed but held: the next schedule's sweepers would take them (a sweep
// takes every SKU's).
func sweepLeftovers(ctx context.Context, svc *sales.Service) error {
	if _, err := svc.ExpireHolds(ctx, 0); err != nil {
		return fmt.Errorf("explore: expire the holds the schedule left lapsed: %w", err)
	}
	return nil
}

// checkBuyerCounts holds each buyer's count of the per-user limit
// (buyer_units) to its orders' rows: the units of its held and paid orders,
// no more (a claim left behind by an order that was not taken, as once
// happened in batched) and no fewer (a return given back twice).
func (x *Explorer) checkBuyerCounts(ctx context.Context, lc Lifecycle, sku string, st *store, holds, rows []inventory.Order, answers []lifecycleAnswer) []string {
	batches, ok := x.store.(batched.Store)
	if !ok {
		return nil
	}
	st.mu.Lock()
	tried := maps.Clone(st.byUser)
	st.mu.Unlock()
	want := map[string]int64{}
	owes := func(o inventory.Order) {
		if _, ok := want[o.UserID]; !ok {
			want[o.UserID] = 0
		}
		if o.State == inventory.OrderHeld || o.State == inventory.OrderPaid {
			want[o.UserID] += o.Quantity
		}
	}
	for i, h := range holds {
		row := rows[i]
		row.UserID = h.UserID
		if !slices.Contains(tried[h.UserID], row.ID) {
			owes(row) // placed before the schedule, not through its store
		} else {
			owes(inventory.Order{UserID: h.UserID})
		}
	}
	for i, act := range lc.Actors {
		if act.Act != Buy {
			continue
		}
		user := act.User
		if user == "" {
			user = "buyer-" + string(rune('A'+i))
		}
		owes(inventory.Order{UserID: user})
	}
	// Every order tried for a buyer, whichever transaction inserted it:
	// one whose commit answer was lost may be there, though its buyer was
	// answered 503.
	for user := range want {
		seen := map[string]bool{}
		for _, id := range tried[user] {
			if seen[id] {
				continue
			}
			seen[id] = true
			if o, found, err := x.store.FindOrder(ctx, id); err == nil && found {
				owes(o)
			}
		}
	}
	users := make([]string, 0, len(want))
	for u := range want {
		users = append(users, u)
	}
	slices.Sort(users)
	var counts map[string]int64
	err := batches.InBatchTx(ctx, func(ctx context.Context, tx batched.Tx) error {
		var err error
		counts, err = tx.LockBuyers(ctx, sku, users)
		return err
	})
	if err != nil {
		return []string{fmt.Sprintf("read the buyers' counts: %v", err)}
	}
	var problems []string
	for _, u := range users {
		if counts[u] != want[u] {
			problems = append(problems, fmt.Sprintf("buyer %s is counted %d units of the limit, but holds or paid for %d by the rows", u, counts[u], want[u]))
		}
	}
	return problems
}

// markedCall is the call, in the history's doubled positions, of actor i's
// second attempt, refused sold out, as the sold-out mark lets it be: a
// mark stands for the refusal that set it, so the refusal it answers may
// be as old as the oldest refusal on the same instance that was answered
// before the attempt was sent, and sent after the bound's step when that
// step came before the attempt (the clock then moved past every older
// mark). A refusal no mark explains keeps its own call, and the history
// then shows a unit refused that was there.
func markedCall(lc Lifecycle, answers []lifecycleAnswer, returned []int64, i int, boundAt int64) int64 {
	call := 2*answers[i].firstAt + 1
	bound := int64(-1)
	if boundAt >= 0 && 2*boundAt < call {
		bound = 2 * boundAt
	}
	type attempt struct{ sent, answered int64 }
	earliest := call
	for j, act := range lc.Actors {
		if act.Act != Buy || act.Instance != lc.Actors[i].Instance {
			continue
		}
		a := answers[j]
		var refused []attempt
		switch {
		case a.first != nil:
			refused = append(refused, attempt{0, 2 * a.firstAt})
			if j != i && errors.Is(a.err, inventory.ErrSoldOut) {
				refused = append(refused, attempt{2*a.firstAt + 1, 2 * returned[j]})
			}
		case errors.Is(a.err, inventory.ErrSoldOut):
			refused = append(refused, attempt{0, 2 * returned[j]})
		}
		for _, r := range refused {
			if r.answered < call && r.sent >= bound {
				earliest = min(earliest, r.sent)
			}
		}
	}
	return earliest
}

// checkLifecycle holds one finished schedule of the lifecycle to the
// rules: the audit adds up (no unit returned twice, none lost, none
// oversold); the units the committed transactions gave back are the units
// of the orders that came back; every answer that names an order's state
// names the state its row has (a state other than held never changes);
// busy and unavailable only where a fault struck the actor; the sweepers
// expired no more orders than there are expired, and exactly as many when
// nothing else expires them; and the buyers' history is linearizable
// against a stock counter that the returns add to.
func (x *Explorer) checkLifecycle(ctx context.Context, lc Lifecycle, sku string, st *store, holds []inventory.Order,
	answers []lifecycleAnswer, returned []int64, boundAt int64, s *scheduler,
) (inventory.Audit, []string) {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	a, err := x.store.Audit(ctx, sku)
	if err != nil {
		return a, []string{fmt.Sprintf("audit: %v", err)}
	}
	if !a.Consistent() {
		add("audit broken: initial %d, available %d, held or paid %d, returned %d (%d cancelled, %d expired orders)",
			a.Initial, a.Available, a.Ordered, a.Returned, a.Cancelled, a.Expired)
	}
	var back int64
	for _, units := range st.returned {
		back += units
	}
	if back != a.Returned {
		add("committed transactions gave back %d units, but the cancelled and expired orders hold %d", back, a.Returned)
	}
	rows := make([]inventory.Order, len(holds))
	for i, h := range holds {
		o, found, err := x.store.FindOrder(ctx, h.ID)
		if err != nil || !found {
			add("hold %d's order %s is not there (%v)", i+1, h.ID, err)
			continue
		}
		rows[i] = o
	}

	initial := lc.Stock
	for _, h := range lc.Holds {
		initial -= h.Quantity
	}
	var ops []history.Op
	swept, sweptKnown, onlySweepers := 0, true, true
	for i, act := range lc.Actors {
		name, ans := string(rune('A'+i)), answers[i]
		onlySweepers = onlySweepers && act.Act == Sweep
		// The units an actor gave back are an operation of its own in
		// the history: taking a negative quantity, which the counter
		// always allows (history's model takes q whenever q <= what is
		// left), is a return. The harness saw them commit: by the
		// actor's answer, or, when its commit answer was lost, by the
		// end of the schedule (its late commit may land after its
		// answer).
		if units := st.returned[i]; units > 0 {
			op := history.Op{Client: i, SKU: sku, Quantity: -units, Return: 2 * returned[i], Outcome: history.OK}
			if s.lostAnswer[i] {
				op.Return = 2 * int64(len(s.trace)+1)
			}
			ops = append(ops, op)
		}
		if said := ans.said(act.Act); said != "" {
			row := rows[act.Hold]
			want := map[Act]string{Pay: inventory.OrderPaid, Cancel: inventory.OrderCancelled}[act.Act]
			switch {
			case ans.err == nil && want != "" && said != want:
				add("%s %s hold %d and was answered with the order %s", name, act.Act, act.Hold+1, said)
			case said != inventory.OrderHeld && said != row.State:
				add("%s %s hold %d and was answered %s, but the order is %s", name, act.Act, act.Hold+1, said, row.State)
			}
			continue
		}
		if act.Act == Buy {
			outcome := outcomeOf(ans.err)
			op := history.Op{Client: i, SKU: sku, Quantity: act.Quantity, Return: 2 * returned[i], Outcome: outcome}
			if ans.first != nil {
				// Two attempts: the first refused, the second sent after
				// that answer (positions are doubled, so that one lies
				// between two of the trace's).
				ops = append(ops, history.Op{Client: i, SKU: sku, Quantity: act.Quantity, Return: 2 * ans.firstAt, Outcome: history.SoldOut})
				op.Call = 2*ans.firstAt + 1
				if outcome == history.SoldOut {
					op.Call = markedCall(lc, answers, returned, i, boundAt)
				}
			}
			ops = append(ops, op)
			switch outcome {
			case history.OK:
				if o, found, err := x.store.FindOrder(ctx, ans.order.ID); err != nil || !found || o.Quantity != act.Quantity {
					add("%s was answered 201 but its order %s is not there (%v)", name, ans.order.ID, err)
				}
				continue
			case history.SoldOut, history.NoEffect:
				for _, id := range st.inserted[i] {
					if _, found, err := x.store.FindOrder(ctx, id); err != nil || found {
						add("%s was refused (%v) but its order %s exists (%v)", name, ans.err, id, err)
					}
				}
			}
			if outcome == history.SoldOut {
				continue
			}
			if errors.Is(ans.err, inventory.ErrLimitReached) {
				if lc.PerUserLimit == 0 {
					add("%s was refused for a per-user limit, with none set: %v", name, ans.err)
				}
				continue
			}
		}
		if act.Act == Sweep {
			swept += ans.swept
			if ans.err == nil {
				continue
			}
			sweptKnown = false
		}
		// What is left is an answer that says nothing of the order:
		// busy, when the actor's lock expired under it or its commit
		// answer was lost; unavailable, when its commit answer was lost.
		switch answer := inventory.Outcome(ans.err); {
		case answer == "busy" && (s.expired[i] || s.lostAnswer[i]):
		case answer == "unavailable" && (s.lostAnswer[i] || errors.Is(ans.err, errLostAnswer)):
		default:
			add("%s %s and was answered %q, which no fault of the schedule explains (lock expired: %v, commit answer lost: %v): %v",
				name, act.Act, answer, s.expired[i], s.lostAnswer[i], ans.err)
		}
	}
	if lc.PerUserLimit > 0 {
		// What each buyer holds or paid for, by the rows: never past the
		// limit, however its orders on several instances interleaved.
		taken := map[string]int64{}
		for i, act := range lc.Actors {
			if act.Act == Buy && answers[i].err == nil {
				taken[answers[i].order.UserID] += act.Quantity
			}
		}
		for user, units := range taken {
			if units > lc.PerUserLimit {
				add("buyer %s was sold %d units under a per-user limit of %d", user, units, lc.PerUserLimit)
			}
		}
		if lc.Reserved == "" {
			// The reservation strategies count buyers in their store.
			problems = append(problems, x.checkBuyerCounts(ctx, lc, sku, st, holds, rows, answers)...)
		}
	}
	switch {
	case int64(swept) > a.Expired:
		add("the sweepers expired %d orders, but %d are expired", swept, a.Expired)
	case onlySweepers && sweptKnown && int64(swept) != a.Expired:
		add("the sweepers expired %d orders and nobody else expires any, but %d are expired", swept, a.Expired)
	}
	verdicts, err := history.Check(ops, map[string]int64{sku: initial}, 10*time.Second, "")
	if err != nil {
		add("linearizability check: %v", err)
	}
	for _, v := range verdicts {
		if !v.Linearizable() {
			add("history not linearizable: %s", v)
		}
	}
	return a, problems
}
