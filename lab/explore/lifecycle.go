package explore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
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
