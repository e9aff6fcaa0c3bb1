package explore_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/explore"
)

// openLifecycle returns an Explorer over a fresh database of the engine,
// with a clock that lapses holds. wrap stands between the explorer and the
// database (a control breaks it there); nil for none.
func openLifecycle(t *testing.T, engine string, wrap func(inventory.Store) inventory.Store) *explore.Explorer {
	t.Helper()
	db, url, waits := openDatabase(t, engine)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clock, err := explore.OpenClock(ctx, url)
	if err != nil {
		t.Fatalf("open the clock on %s: %v", engine, err)
	}
	t.Cleanup(clock.Close)
	var under inventory.Store = db
	if wrap != nil {
		under = wrap(db)
	}
	x := explore.New(under, waits.Blocked).WithClock(clock)
	// The reservation strategies' stores, writing into the database itself.
	return withReservations(t, x, db, func(db store.Store) reservation.Sink { return db })
}

// lifecycleShape is a lifecycle scenario without its strategy.
type lifecycleShape struct {
	name    string
	stock   int64
	holds   []explore.Hold
	actors  []explore.Actor
	max     int
	samples int
	// limit is PER_USER_LIMIT (0: none).
	limit int64
	// soldOutBound: the sold-out mark's bound passes at a step of the
	// schedule (Lifecycle.SoldOutBound).
	soldOutBound bool
}

// lifecycleShapes are the races of the lifecycle: each pits two
// transitions of the same held order (or the return of a unit and a buyer
// who wants it) against each other while the hold may lapse at any step.
func lifecycleShapes(t *testing.T) []lifecycleShape {
	lapses := []explore.Hold{{Quantity: 1, Lapse: explore.LapsesInSchedule}}
	return []lifecycleShape{
		{name: "a pay racing the sweep", stock: 1, holds: lapses,
			actors: []explore.Actor{{Act: explore.Pay}, {Act: explore.Sweep}},
			max:    scaled(t, 80), samples: scaled(t, 20)},
		{name: "a cancel retried on a second instance", stock: 1, holds: lapses,
			actors: []explore.Actor{{Act: explore.Cancel}, {Act: explore.Cancel, Instance: 1}},
			max:    scaled(t, 80), samples: scaled(t, 20)},
		// One sweep transaction a hold: the second sweeper skips the hold
		// the first has locked and takes the next, or finds none.
		{name: "two sweepers, one hold lapsed and one lapsing", stock: 3,
			holds:  []explore.Hold{{Quantity: 1, Lapse: explore.LapsedBefore}, {Quantity: 2, Lapse: explore.LapsesInSchedule}},
			actors: []explore.Actor{{Act: explore.Sweep, Batch: 1}, {Act: explore.Sweep, Batch: 1, Instance: 1}},
			max:    scaled(t, 80), samples: scaled(t, 20)},
		{name: "a buyer for the last unit while the sweep returns it", stock: 1, holds: lapses,
			actors: []explore.Actor{{Act: explore.Sweep}, {Act: explore.Buy, Quantity: 1, Instance: 1}},
			max:    scaled(t, 120), samples: scaled(t, 30)},
		{name: "a buyer for the last unit while a lookup expires its hold", stock: 1, holds: lapses,
			actors: []explore.Actor{{Act: explore.Look}, {Act: explore.Buy, Quantity: 1, Instance: 1}},
			max:    scaled(t, 120), samples: scaled(t, 30)},
		// Stock enough for both: only the limit may refuse one.
		{name: "one buyer ordering twice on two instances, PER_USER_LIMIT=1", stock: 2, limit: 1,
			actors: []explore.Actor{{Act: explore.Buy, Quantity: 1, User: "twice"}, {Act: explore.Buy, Quantity: 1, User: "twice", Instance: 1}},
			max:    scaled(t, 120), samples: scaled(t, 30)},
		// Two buyers for the last unit under a limit: the one refused sold
		// out claimed nothing that stays (batched claims before the stock
		// and gives back what it did not cover; a review found MariaDB's
		// giving back broken, which no row ran).
		{name: "two buyers for the last unit, PER_USER_LIMIT=1", stock: 1, limit: 1,
			actors: []explore.Actor{{Act: explore.Buy, Quantity: 1}, {Act: explore.Buy, Quantity: 1}},
			max:    scaled(t, 80), samples: scaled(t, 20)},
		// The sold-out mark (SOLD_OUT_TTL): the buyer's first click is
		// refused while the unit is held, which marks the SKU sold out on
		// its instance; the cancel gives the unit back through the other
		// instance, and the mark's bound passes at any step. Once it has
		// passed, a unit given back is the buyer's on its next click.
		{name: "a buyer clicking again while a cancel on another instance gives the unit back", stock: 1,
			holds:  []explore.Hold{{Quantity: 1}},
			actors: []explore.Actor{{Act: explore.Buy, Quantity: 1, Retry: true}, {Act: explore.Cancel, Instance: 1}},
			max:    scaled(t, 120), samples: scaled(t, 30), soldOutBound: true},
	}
}

// holding keeps the candidates whose strategies take held orders: every
// safe one (the reservation strategies' returns are relayed to Redis). The
// controls are left out: the lifecycle's transitions are the service's,
// the same code whatever the strategy, and a control's oversell (which
// TestEverySchedule catches) would only hide what broke in them.
func holding(all []candidate) []candidate {
	var cs []candidate
	for _, c := range all {
		if !c.unsafe {
			cs = append(cs, c)
		}
	}
	return cs
}

// TestEveryLifecycleSchedule runs the races of the order lifecycle —
// a pay against the sweep, a cancel retried on a second instance, two
// sweepers, a buyer for a unit an expiry returns — for every strategy that
// takes holds, on both engines, every schedule or a budget of them plus a
// seeded sample, with the hold lapsing at any step and a commit answer
// lost. No unit comes back twice or is lost, every answer is true to the
// order rows, and nothing is answered busy or unavailable that no fault
// explains.
func TestEveryLifecycleSchedule(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := openLifecycle(t, engine, nil)
			ctx := context.Background()
			s := seed(t)
			// MariaDB's SKIP LOCKED sometimes waits for a row another
			// transaction holds instead of skipping it: a schedule that did
			// not replay is run again, and one that still does not is left
			// out and counted. On PostgreSQL one is a bug of the harness.
			retry := 0
			if engine == "mysql" {
				retry = 2
			}
			for _, shape := range lifecycleShapes(t) {
				for _, c := range holding(candidates()) {
					lc := explore.Lifecycle{
						Name:            fmt.Sprintf("%s, %s on %s", shape.name, c.name, engine),
						Stock:           shape.stock,
						Holds:           shape.holds,
						Actors:          shape.actors,
						Strategy:        c.strategy,
						Faults:          c.faults,
						PerUserLimit:    shape.limit,
						SoldOutBound:    shape.soldOutBound,
						MaxSchedules:    shape.max,
						Samples:         shape.samples,
						Seed:            s,
						RetryUnreplayed: retry,
						Reserved:        c.reserved,
					}
					r, err := x.ExploreLifecycle(ctx, lc)
					if err != nil {
						t.Fatalf("%s: %v", lc.Name, err)
					}
					t.Log(r)
					for _, f := range r.Failures {
						t.Errorf("%s: %s", lc.Name, f)
					}
					// A few left out leave the walk meaningful; many would
					// make it a sample of what happens to replay.
					if r.Unreplayed*20 > r.Schedules {
						t.Errorf("%s: %d schedules did not replay, more than 5%% of %d", lc.Name, r.Unreplayed, r.Schedules)
					}
				}
			}
		})
	}
}

// TestLifecycleCoversEveryHoldingStrategy: the lifecycle runs every
// registered strategy but the controls and the reservation strategies.
func TestLifecycleCoversEveryHoldingStrategy(t *testing.T) {
	var got []string
	for _, c := range holding(allCandidates()) {
		got = append(got, c.covers()...)
	}
	for _, s := range strategies.All() {
		takesHolds := s.Safe()
		if takesHolds != slices.Contains(got, s.Name) {
			t.Errorf("%s: takes holds %v, but the lifecycle runs it: %v", s.Name, takesHolds, !takesHolds)
		}
	}
}

// TestReplayTheLifecycleRaces replays one schedule of each outcome of two
// races, on both engines: the pay and the sweep (whichever's UPDATE comes
// first after the lapse wins, and the other is told so), and a buyer for
// the last unit, which gets it only once the sweep's return committed.
func TestReplayTheLifecycleRaces(t *testing.T) {
	lapses := []explore.Hold{{Quantity: 1, Lapse: explore.LapsesInSchedule}}
	payAndSweep := []explore.Actor{{Act: explore.Pay}, {Act: explore.Sweep}}
	sweepAndBuy := []explore.Actor{{Act: explore.Sweep}, {Act: explore.Buy, Quantity: 1, Instance: 1}}
	cases := []struct {
		name   string
		actors []explore.Actor
		// steps are the schedule's first steps; then the lowest actor
		// moves first, and an unnamed lapse comes last.
		steps []string
		want  []string
		left  int64 // available afterwards
	}{
		{name: "the pay reads the hold, it lapses, the sweep expires it", actors: payAndSweep,
			steps: []string{"A: find order", "hold 1: lapses", "B: sweep lapsed holds", "B: return units", "B: commit"},
			want:  []string{inventory.OrderExpired, "swept 1"}, left: 1},
		{name: "the pay commits before the lapse", actors: payAndSweep,
			want: []string{inventory.OrderPaid, "swept 0"}, left: 0},
		// The clock's UPDATE waits for the pay's row lock, and the sweep
		// may not start while it waits (its statement could queue behind
		// the same lock).
		{name: "the hold lapses while the pay's UPDATE holds the row", actors: payAndSweep,
			steps: []string{"A: find order", "A: settle paid", "hold 1: lapses", "A: commit", "B: sweep lapsed holds", "B: commit"},
			want:  []string{inventory.OrderPaid, "swept 0"}, left: 0},
		{name: "the buyer reads after the sweep's return committed", actors: sweepAndBuy,
			steps: []string{"hold 1: lapses", "A: sweep lapsed holds", "A: return units", "A: commit", "B: read", "B: write", "B: commit"},
			want:  []string{"swept 1", "created"}, left: 0},
		{name: "the buyer reads before the sweep's return committed", actors: sweepAndBuy,
			steps: []string{"hold 1: lapses", "A: sweep lapsed holds", "A: return units", "B: read", "A: commit"},
			want:  []string{"swept 1", "sold_out"}, left: 1},
	}
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := openLifecycle(t, engine, nil)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					lc := explore.Lifecycle{Name: c.name, Stock: 1, Holds: lapses, Actors: c.actors,
						Strategy: func(explore.Env) inventory.Strategic {
							return sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(0), sqlrow.WithBackoff(0, 0))
						}}
					run, err := x.ReplayLifecycle(context.Background(), lc, c.steps)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(run.Outcomes, c.want) || run.Audit.Available != c.left || len(run.Problems) > 0 {
						t.Errorf("answers %v (want %v), %d left (want %d), problems %v\n    schedule: %s",
							run.Outcomes, c.want, run.Audit.Available, c.left, run.Problems, strings.Join(run.Schedule, " → "))
					}
				})
			}
		})
	}
}

// settleWithoutHeldCheck is the store with the mistake the lifecycle's
// invariant forbids: its transition's UPDATE lacks `state = 'held'`, so it
// moves an order that another transition moved already, as long as the
// hold's side of expires_at matches, and the units of a cancel come back a
// second time.
type settleWithoutHeldCheck struct{ inventory.Store }

func (s settleWithoutHeldCheck) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, sloppyTx{tx})
	})
}

type sloppyTx struct{ inventory.Tx }

// SessionID tells the explorer the session, as the adapters' do.
func (t sloppyTx) SessionID(ctx context.Context) (int64, error) {
	return t.Tx.(interface {
		SessionID(context.Context) (int64, error)
	}).SessionID(ctx)
}

func (t sloppyTx) SettleOrder(ctx context.Context, id, userID, to string) (bool, error) {
	moved, err := t.Tx.SettleOrder(ctx, id, userID, to)
	if err != nil || moved {
		return moved, err
	}
	o, err := t.Tx.GetOrder(ctx, id)
	if err != nil {
		return false, err
	}
	// The UPDATE's other conditions: the buyer, and the hold's side of
	// now (the holds here never lapse, so the clock's skew cannot matter).
	lapsed := !o.ExpiresAt.After(time.Now())
	return o.UserID == userID && lapsed == (to == inventory.OrderExpired), nil
}

// TestHarnessCatchesAUnitReturnedTwice: the control of the lifecycle
// scenarios. With a transition that does not check that the order is still
// held, a cancel retried on a second instance gives the units back twice
// in the schedules where both cancels read the order held before either
// committed, and the checks must catch it.
func TestHarnessCatchesAUnitReturnedTwice(t *testing.T) {
	x := openLifecycle(t, "postgres", func(db inventory.Store) inventory.Store { return settleWithoutHeldCheck{db} })
	lc := explore.Lifecycle{Name: "a cancel retried on a second instance, without the held check", Stock: 1,
		Holds:  []explore.Hold{{Quantity: 1}},
		Actors: []explore.Actor{{Act: explore.Cancel}, {Act: explore.Cancel, Instance: 1}},
		Strategy: func(explore.Env) inventory.Strategic {
			return sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(0), sqlrow.WithBackoff(0, 0))
		},
		MaxSchedules: 400, Samples: 200, Seed: 1}
	r, err := x.ExploreLifecycle(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Failed == 0 {
		t.Fatalf("%s: no schedule broke a rule", lc.Name)
	}
	f := r.Failures[0]
	t.Logf("caught, as it must be: %s", f)
	if problems := strings.Join(f.Problems, "; "); !strings.Contains(problems, "audit broken") {
		t.Errorf("the first failure does not show the audit broken: %s", problems)
	}
}

// TestHarnessCatchesAMarkPastItsBound: the control of the sold-out mark's
// bound. With a mark that outlives it, the buyer's second click is refused
// in the schedules where the cancel gave the unit back and the bound
// passed before that click, and the history must show a unit refused that
// was there; the schedules where the mark was still in its time, or the
// unit not yet back, stay right.
func TestHarnessCatchesAMarkPastItsBound(t *testing.T) {
	x := openLifecycle(t, "postgres", nil)
	lc := explore.Lifecycle{Name: "a buyer clicking again while a cancel on another instance gives the unit back, the mark outliving its bound", Stock: 1,
		Holds:        []explore.Hold{{Quantity: 1}},
		Actors:       []explore.Actor{{Act: explore.Buy, Quantity: 1, Retry: true}, {Act: explore.Cancel, Instance: 1}},
		Strategy:     func(explore.Env) inventory.Strategic { return sqlrow.NewConditional() },
		SoldOutBound: true, MarkOutlivesBound: true,
		MaxSchedules: 200, Samples: 0, Seed: 1}
	r, err := x.ExploreLifecycle(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Failed == 0 || r.Failed == r.Schedules {
		t.Fatalf("%s: %d of %d schedules broke a rule, want some and not all", lc.Name, r.Failed, r.Schedules)
	}
	f := r.Failures[0]
	t.Logf("caught, as it must be: %s", f)
	if problems := strings.Join(f.Problems, "; "); !strings.Contains(problems, "not linearizable") {
		t.Errorf("the first failure does not show the history broken: %s", problems)
	}
}

// limitIgnored is a store whose transactions take every claim of a buyer's
// units without counting them: the per-user limit never checked.
type limitIgnored struct{ inventory.Store }

func (s limitIgnored) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, claimAllTx{sloppyTx{tx}})
	})
}

type claimAllTx struct{ sloppyTx }

func (claimAllTx) ClaimUnits(context.Context, string, string, int64, int64) (bool, error) {
	return true, nil
}

// TestHarnessCatchesABuyerPastTheLimit: the control of the per-user limit's
// row. With a limit that is never checked, one buyer's two orders on two
// instances both succeed, and the checks must say so.
func TestHarnessCatchesABuyerPastTheLimit(t *testing.T) {
	x := openLifecycle(t, "mysql", func(db inventory.Store) inventory.Store { return limitIgnored{db} })
	lc := explore.Lifecycle{Name: "one buyer ordering twice on two instances, the limit unchecked", Stock: 2, PerUserLimit: 1,
		Actors:       []explore.Actor{{Act: explore.Buy, Quantity: 1, User: "twice"}, {Act: explore.Buy, Quantity: 1, User: "twice", Instance: 1}},
		Strategy:     func(explore.Env) inventory.Strategic { return sqlrow.NewConditional() },
		MaxSchedules: 100, Samples: 0, Seed: 1, RetryUnreplayed: 2}
	r, err := x.ExploreLifecycle(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if r.Failed == 0 {
		t.Fatalf("%s: no schedule broke a rule", lc.Name)
	}
	if problems := strings.Join(r.Failures[0].Problems, "; "); !strings.Contains(problems, "per-user limit of 1") {
		t.Errorf("the first failure does not name the limit: %s", problems)
	}
}

// returnsDropped is a reservation store that never gives returned units
// back (a relay that clears the marks and does nothing): the control of
// the reservation strategies' lifecycle rows.
type returnsDropped struct{ reservation.Reservations }

func (returnsDropped) Return(context.Context, string, int64, []inventory.Order) error { return nil }

func (r returnsDropped) GiveBack(ctx context.Context, kind reservation.RelayKind, marked []reservation.Marked) []error {
	if kind == reservation.Returns {
		return make([]error, len(marked))
	}
	return r.Reservations.GiveBack(ctx, kind, marked)
}

// TestHarnessCatchesALostReturn: with returns that never reach Redis, a
// sweep gives a lapsed hold's unit back in the database only; the buyer
// after it is refused by Redis while the database says the unit is there,
// and the checks must say that the store's books are not the database's:
// in every schedule, whatever the order of the sweep and the buyer.
func TestHarnessCatchesALostReturn(t *testing.T) {
	x := openLifecycle(t, "postgres", nil)
	lc := explore.Lifecycle{Name: "a buyer while the sweep returns the last unit, returns lost on their way to Redis", Stock: 1,
		Holds:    []explore.Hold{{Quantity: 1, Lapse: explore.LapsedBefore}},
		Actors:   []explore.Actor{{Act: explore.Sweep}, {Act: explore.Buy, Quantity: 1, Instance: 1}},
		Reserved: strategies.NameRedisReserve,
		Strategy: func(env explore.Env) inventory.Strategic {
			return reservation.NewReserved(returnsDropped{env.Reservations}, env.Sales)
		},
		MaxSchedules: 100, Seed: 1}
	r, err := x.ExploreLifecycle(context.Background(), lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if !r.Exhaustive || r.Failed != r.Schedules {
		t.Fatalf("%s: %d of %d schedules broke a rule, want all", lc.Name, r.Failed, r.Schedules)
	}
	t.Logf("caught, as it must be: %s", r.Failures[0])
}

// TestTwoBatchesOfOneBuyerDoNotDeadlock replays, in today's steps, the
// schedule that caught a deadlock on MariaDB: two instances' batches of one
// new buyer. Then each read the buyer's missing row with FOR UPDATE (on
// MariaDB, a gap lock on its place) and deducted, the second waiting for
// the first's stock row lock while the first's claim inserted into the gap
// the second locked. Now a batch claims first, creating the buyer's row
// before it touches the stock (ClaimFirstUnits): the second waits for the
// first's insert, holding nothing the first needs, then finds the row,
// reads it locked, and refuses the order past the limit.
func TestTwoBatchesOfOneBuyerDoNotDeadlock(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			x := openLifecycle(t, engine, nil)
			lc := explore.Lifecycle{Name: "one buyer ordering twice on two instances, batched", Stock: 2, PerUserLimit: 1,
				Actors: []explore.Actor{{Act: explore.Buy, Quantity: 1, User: "twice"}, {Act: explore.Buy, Quantity: 1, User: "twice", Instance: 1}},
				Strategy: func(env explore.Env) inventory.Strategic {
					return batched.New(env.Store, batched.WithQueueObserver(env.Queue), batched.WithLogger(slog.New(slog.DiscardHandler)))
				}}
			steps := []string{"B: join the batch queue", "B: claim buyer's units", "A: join the batch queue", "A: claim buyer's units", "B: write", "B: commit", "A: read for update", "A: commit"}
			run, err := x.ReplayLifecycle(context.Background(), lc, steps)
			if err != nil {
				t.Fatal(err)
			}
			created := slices.Index(run.Outcomes, "created") >= 0
			if !created || len(run.Problems) > 0 || run.Audit.Orders != 1 {
				t.Errorf("answers %v, audit %+v, problems %v\n    schedule: %s", run.Outcomes, run.Audit, run.Problems, strings.Join(run.Schedule, " → "))
			}
		})
	}
}
