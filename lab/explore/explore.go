// Package explore checks a strategy against every schedule of a few buyers,
// not a random sample of them.
//
// Each buyer runs the service's real code (sales.Service and the
// strategy under test) against the real database. The harness wraps the
// store and the lock so that every buyer parks before each step that can
// race with another — a read or write of the stock row, a commit, taking or
// giving back the lock, looking up an order — and a scheduler lets exactly
// one of them move at a time. A buyer whose statement waits inside the
// database for a row lock is seen there (the server's own lock view), and
// the scheduler goes on with the others until it moves again.
//
// Besides the order of the steps, the scheduler chooses faults: the lock
// expiring under its holder without the holder hearing of it (a paused
// holder), and a commit whose answer is lost (the buyer hears "outcome
// unknown" while its COMMIT lands later, at a step the scheduler picks).
//
// The choices form a tree. Explore walks it depth first — each schedule is
// run again from the start on a fresh SKU, because a real database cannot
// be rewound — and when the tree is larger than its budget it draws a
// seeded random sample of the rest. After each schedule it checks the
// audit (no unit oversold, every unit that left the stock is an order),
// every answer against the order rows, the rule that a schedule without
// faults answers every buyer 201 or 409, and the buyers' history for
// linearizability against a stock counter (porcupine).
//
// The order lifecycle is explored the same way (Lifecycle): orders held
// before the schedule, actors that pay, cancel, look up or sweep them or
// buy, each transition and return of units a step, and a hold that lapses
// at a step the scheduler picks (Clock). Its checks are the audit (no unit
// returned twice, none lost), every answer against the order's row, and
// the sweepers' counts against the expired orders.
//
// This is stateless model checking in the manner of CHESS and of
// FoundationDB's deterministic simulation, but over the real server:
// schedules are replayed, not simulated.
package explore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
)

// Scenario is one exploration: a strategy, a stock, the buyers and the
// faults the scheduler may inject.
type Scenario struct {
	Name string
	// Stock is what the sale starts with; Quantities what each buyer asks
	// for, one buyer each.
	Stock      int64
	Quantities []int64
	// Strategy builds the strategy under test for one schedule from what
	// the schedule gives it.
	Strategy func(Env) inventory.Strategic
	Faults   Faults
	// RetryUnreplayed is as Lifecycle's: how often a schedule the server
	// did not replay is run again before it is counted and left out; 0:
	// it is an error. MariaDB's SKIP LOCKED (a batched lane's) needs it.
	RetryUnreplayed int
	// Retry makes the buyers one client: the same request under the same
	// idempotency key, sent again while the first is still under way (a
	// retry after a timeout or a 503). Quantities must then be equal.
	Retry bool
	// MaxSchedules bounds the depth-first walk; Samples schedules are then
	// drawn at random from Seed when the walk did not finish.
	MaxSchedules int
	Samples      int
	Seed         uint64
	// Reserved names the Explorer's reservation store (WithReservations)
	// the strategy takes orders into; a writer entity moves them into the
	// database one batch a step, the sale is started through the
	// strategy, and the checks run once the writer has moved everything.
	// "" for the strategies that write the database themselves.
	Reserved string
	// PerUserLimit, when above 0, makes every buyer one user (no
	// idempotency key: separate orders) and is the service's
	// PER_USER_LIMIT: no more than it is sold to the user, and a buyer
	// refused limit_reached was refused truly.
	PerUserLimit int64
	// Instances is how many services (instances, each with its own
	// strategy from Strategy) the buyers are spread over, buyer i on
	// instance i mod Instances; 0 or 1: one.
	Instances int
	// Stocks, when set, puts several SKUs on sale, SKU j with Stocks[j]
	// units (Stock is then unused), and SKUOf[i] is the SKU buyer i
	// orders: a batch that spans SKUs. Every SKU is audited and its
	// history checked. Not with Retry, PerUserLimit or Reserved.
	Stocks []int64
	SKUOf  []int
}

// skus names the schedule's SKUs (base for one) and their stocks, and
// returns the SKU of each buyer.
func (sc Scenario) skus(base string) (names []string, stocks []int64, of []string) {
	if len(sc.Stocks) == 0 {
		names, stocks = []string{base}, []int64{sc.Stock}
		for range sc.Quantities {
			of = append(of, base)
		}
		return names, stocks, of
	}
	for j, n := range sc.Stocks {
		names, stocks = append(names, fmt.Sprintf("%s-%c", base, 'a'+j)), append(stocks, n)
	}
	for i := range sc.Quantities {
		of = append(of, names[sc.SKUOf[i]])
	}
	return names, stocks, of
}

// Env is what one schedule gives the strategy under test: the scheduler's
// lock; the database as a batch store, each statement a step (for
// strategies that own their transactions); and the observer of orders that
// wait in the process for another's goroutine (a batch's leader).
type Env struct {
	Locker locked.Locker
	Store  batched.Store
	Queue  batched.QueueObserver
	// Reservations and Sales are the reservation store, each call of a
	// buyer a step, and the database's side of it (Scenario.Reserved).
	Reservations reservation.Reservations
	Sales        reservation.EpochSales
}

// Faults are what the scheduler may inject into one schedule.
type Faults struct {
	// Max is how many faults one schedule may have.
	Max int
	// LeaseExpiry: the lock may expire under its holder at any step,
	// without the holder noticing.
	LeaseExpiry bool
	// LostCommitAnswer: a commit may land while its buyer is told the
	// outcome is unknown, at any later step.
	LostCommitAnswer bool
}

// Report is what an exploration found.
type Report struct {
	Scenario  string
	Schedules int
	// Exhaustive is true when every schedule was run.
	Exhaustive bool
	Sampled    int
	Seed       uint64
	Elapsed    time.Duration
	// Failures are the schedules that broke a rule, the first few of them;
	// Failed counts them all.
	Failures []Failure
	Failed   int
	// Unreplayed counts the schedules the server did not replay, even
	// when run again (Lifecycle.RetryUnreplayed): the choices after the
	// same steps differed (a statement waited for a lock that it had
	// not waited for before). The untried choices at that point were
	// left out. Rerun counts the runs again of a schedule that did not
	// replay at first.
	Unreplayed int
	Rerun      int
}

func (r Report) String() string {
	how := "every schedule"
	if !r.Exhaustive {
		how = fmt.Sprintf("the first %d schedules depth first and %d sampled with seed %d", r.Schedules-r.Sampled, r.Sampled, r.Seed)
	}
	s := fmt.Sprintf("%s: %d schedules (%s) in %s, %d broke a rule", r.Scenario, r.Schedules, how, r.Elapsed.Round(time.Millisecond), r.Failed)
	if r.Rerun > 0 {
		s += fmt.Sprintf(", %d runs again of a schedule that did not replay at first", r.Rerun)
	}
	if r.Unreplayed > 0 {
		s += fmt.Sprintf(", %d did not replay even so (their untried siblings left out)", r.Unreplayed)
	}
	return s
}

// Failure is one schedule that broke a rule.
type Failure struct {
	Schedule []string
	Problems []string
	// Sample is the index of the sampled schedule (from the report's
	// seed), or -1 for one of the depth-first walk.
	Sample int
}

func (f Failure) String() string {
	where := "depth-first walk"
	if f.Sample >= 0 {
		where = fmt.Sprintf("sample %d", f.Sample)
	}
	return fmt.Sprintf("%s (%s)\n    schedule: %s", strings.Join(f.Problems, "; "), where, strings.Join(f.Schedule, " → "))
}

// Explorer runs scenarios against one real store.
type Explorer struct {
	store   inventory.Store
	blocked Blocked
	runs    int
	prefix  string
	res     map[string]Reservations
	clock   *Clock
}

// WithClock gives the explorer the clock that lapses holds, for lifecycle
// scenarios whose holds lapse (Lifecycle).
func (x *Explorer) WithClock(c *Clock) *Explorer {
	x.clock = c
	return x
}

// WithReservations gives the explorer a reservation store under a name,
// for scenarios whose Reserved names it.
func (x *Explorer) WithReservations(name string, r Reservations) *Explorer {
	if x.res == nil {
		x.res = map[string]Reservations{}
	}
	x.res[name] = r
	return x
}

// New returns an Explorer over db, a real store whose transactions tell
// their session (internal/postgres, internal/mysql), and blocked, which asks
// the same server whether a session waits for a lock (ObserveWaits).
func New(db inventory.Store, blocked Blocked) *Explorer {
	return &Explorer{store: db, blocked: blocked, prefix: fmt.Sprintf("x%d-", rand.Uint32())}
}

// maxFailures is how many failing schedules a report keeps.
const maxFailures = 3

// Explore runs the scenario's schedules and reports what broke. An error
// means the harness itself could not go on (the database went away, a
// schedule did not replay the same).
func (x *Explorer) Explore(ctx context.Context, sc Scenario) (Report, error) {
	return walk(ctx, sc.Name, sc.MaxSchedules, sc.Samples, sc.Seed, sc.RetryUnreplayed, func(pick picker) (result, error) {
		return x.run(ctx, sc, pick)
	})
}

// picker chooses, at each choice point of a schedule, the index of the
// choice taken.
type picker func(depth int, cs []choice) (int, error)

// walk runs the schedules of one scenario, each by run: depth first up to
// maxSchedules, then samples drawn at random from seed when the walk did
// not finish. A schedule that does not replay is an error, unless retries
// is above 0: then it is run again up to retries times, and if it still
// does not replay, it is counted (Report.Unreplayed) and the untried
// choices where it diverged are left out.
func walk(ctx context.Context, name string, maxSchedules, samples int, seed uint64, retries int, run func(picker) (result, error)) (Report, error) {
	began := time.Now()
	r := Report{Scenario: name, Seed: seed}
	note := func(res result, sample int) {
		r.Schedules++
		if len(res.problems) == 0 {
			return
		}
		r.Failed++
		if len(r.Failures) < maxFailures {
			r.Failures = append(r.Failures, Failure{Schedule: res.trace, Problems: res.problems, Sample: sample})
		}
	}

	// Depth first: each frame is a choice point of the current schedule,
	// with the names of its choices (a replay must offer the same) and
	// the one taken.
	type frame struct {
		names []string
		taken int
	}
	var stack []frame
	tries := 0
	for r.Schedules+r.Unreplayed < maxSchedules {
		res, err := run(func(depth int, cs []choice) (int, error) {
			if depth < len(stack) {
				f := stack[depth]
				if got := choiceNames(cs); strings.Join(got, "|") != strings.Join(f.names, "|") {
					var taken []string
					for _, g := range stack[:depth] {
						taken = append(taken, g.names[g.taken])
					}
					return 0, &divergence{depth: depth, err: fmt.Errorf("explore: schedule did not replay: after %s the choices were %v, before %v",
						strings.Join(taken, " → "), got, f.names)}
				}
				return f.taken, nil
			}
			stack = append(stack, frame{names: choiceNames(cs)})
			return 0, nil
		})
		var d *divergence
		switch {
		case errors.As(err, &d) && tries < retries:
			tries++
			r.Rerun++
			continue
		case errors.As(err, &d) && retries > 0:
			r.Unreplayed++
			stack = stack[:d.depth+1]
			stack[d.depth].taken = len(stack[d.depth].names) - 1
		case err != nil:
			return r, err
		default:
			note(res, -1)
		}
		tries = 0
		for len(stack) > 0 && stack[len(stack)-1].taken+1 >= len(stack[len(stack)-1].names) {
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			r.Exhaustive = r.Unreplayed == 0
			break
		}
		stack[len(stack)-1].taken++
	}
	if !r.Exhaustive {
		rng := rand.New(rand.NewPCG(seed, 0x5ced))
		for i := range samples {
			res, err := run(func(_ int, cs []choice) (int, error) { return rng.IntN(len(cs)), nil })
			if err != nil {
				return r, err
			}
			note(res, i)
			r.Sampled++
		}
	}
	r.Elapsed = time.Since(began)
	return r, nil
}

// divergence is the error of a schedule that did not replay: at depth, the
// choices were not those of the schedule it replayed.
type divergence struct {
	depth int
	err   error
}

func (d *divergence) Error() string { return d.err.Error() }
func (d *divergence) Unwrap() error { return d.err }

func choiceNames(cs []choice) []string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.String()
	}
	return names
}

// result is one schedule's run.
type result struct {
	trace    []string
	problems []string
	outcomes []string
	audit    inventory.Audit
}

// Run is one schedule that Replay ran: the steps taken, each buyer's answer
// (inventory.Outcome: "created", "sold_out", "busy", "unavailable", …), the
// audit after it, and the rules it broke.
type Run struct {
	Schedule []string
	Outcomes []string
	Audit    inventory.Audit
	Problems []string
}

// Replay runs one schedule: the steps named in prefix (as the reports name
// them, such as "A: read", "lock expires" or "B: commit, answer lost"), in
// that order, and then, until every buyer is done, always the first thing
// that may happen next — the lowest buyer's step. An error says that a step
// of prefix could not happen when its turn came.
func (x *Explorer) Replay(ctx context.Context, sc Scenario, prefix []string) (Run, error) {
	return replay(prefix, func(pick picker) (result, error) { return x.run(ctx, sc, pick) })
}

// replay runs one schedule by run, taking the steps of prefix and then
// always the first choice.
func replay(prefix []string, run func(picker) (result, error)) (Run, error) {
	res, err := run(func(depth int, cs []choice) (int, error) {
		if depth >= len(prefix) {
			return 0, nil
		}
		for i, c := range cs {
			if c.String() == prefix[depth] {
				return i, nil
			}
		}
		return 0, fmt.Errorf("explore: step %d, %q, cannot happen now; what can: %v", depth+1, prefix[depth], choiceNames(cs))
	})
	if err != nil {
		return Run{}, err
	}
	return Run{Schedule: res.trace, Outcomes: res.outcomes, Audit: res.audit, Problems: res.problems}, nil
}

type answer struct {
	order inventory.Order
	err   error
}

// run runs one schedule, asking pick at each choice point, and checks it.
func (x *Explorer) run(ctx context.Context, sc Scenario, pick picker) (result, error) {
	x.runs++
	sku := fmt.Sprintf("%s%d", x.prefix, x.runs)
	s := newScheduler(x.blocked, sc.Faults)
	st := newStore(x.store, s)
	env := Env{Locker: &locker{s: s}, Store: st, Queue: queue{s}}
	var w *writer
	if sc.Reserved != "" {
		r, ok := x.res[sc.Reserved]
		if !ok {
			return result{}, fmt.Errorf("explore: no reservation store %q (WithReservations)", sc.Reserved)
		}
		w = newWriter(s, r.Write, len(sc.Quantities))
		env.Reservations, env.Sales = &reservations{Reservations: r.Store, st: st, w: w}, r.Sales
	}
	services := make([]*sales.Service, max(1, sc.Instances))
	clock := newStepClock()
	for i := range services {
		services[i] = sales.NewService(st, sc.Strategy(env),
			// The scheduler decides what happens when; no deadline may,
			// and no sold-out mark's bound passes (the clock moves a
			// nanosecond a reading).
			sales.WithOrderTimeout(time.Minute),
			sales.WithClock(clock.now),
			sales.WithPerUserLimit(sc.PerUserLimit),
			sales.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	}
	svc := services[0]
	if len(sc.Stocks) > 0 && (len(sc.SKUOf) != len(sc.Quantities) || sc.Retry || sc.PerUserLimit > 0 || sc.Reserved != "") {
		return result{}, fmt.Errorf("explore: %s: Stocks needs a SKU per buyer (SKUOf), and no Retry, PerUserLimit or Reserved", sc.Name)
	}
	skus, stocks, skuOf := sc.skus(sku)
	// Through the service: a strategy that counts stock elsewhere starts
	// the sale there too. (No buyer's context: the steps pass through.)
	for j, name := range skus {
		if err := svc.StartSale(ctx, name, stocks[j]); err != nil {
			return result{}, err
		}
	}

	answers := make([]answer, len(sc.Quantities))
	buyers := make([]*entity, len(sc.Quantities))
	for i, q := range sc.Quantities {
		e := s.newEntity(string(rune('A'+i)), i)
		buyers[i] = e
		req := inventory.Request{SKU: skuOf[i], Quantity: q, UserID: "buyer-" + e.name}
		if sc.Retry {
			req.UserID, req.IdempotencyKey = "buyer", "key-"+sku
		}
		if sc.PerUserLimit > 0 {
			req.UserID = "buyer"
		}
		instance := services[i%len(services)]
		go func() {
			o, err := instance.PlaceOrder(withEntity(ctx, e), req)
			answers[i] = answer{order: o, err: err}
			if w != nil {
				w.buyerDone()
			}
			s.events <- event{e: e, kind: evDone}
		}()
	}
	if w != nil {
		go w.run(ctx, sku)
	}
	returned, err := s.drive(ctx, pick, buyers)
	if err != nil {
		return result{trace: s.trace}, err
	}
	res := result{trace: s.trace}
	for _, a := range answers {
		res.outcomes = append(res.outcomes, inventory.Outcome(a.err))
	}
	if len(skus) > 1 {
		res.problems = x.checkSKUs(ctx, sc, skus, stocks, skuOf, st, answers, returned, s)
		return res, nil
	}
	res.audit, res.problems = x.check(ctx, sc, sku, st, answers, returned, s)
	if w != nil {
		res.problems = append(res.problems, x.checkReserved(ctx, svc, sku, w)...)
	}
	return res, nil
}
