package explore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/explore"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// open returns an Explorer over a fresh database of the engine, with a
// reservation store on a durable redis-server of its own (redis-reserve).
func open(t *testing.T, engine string) *explore.Explorer {
	t.Helper()
	return openWith(t, engine, func(db store.Store) reservation.Sink { return db })
}

// openWith is open with the database side of redis-reserve's writer given
// by sink (a control may break it).
func openWith(t *testing.T, engine string, sink func(store.Store) reservation.Sink) *explore.Explorer {
	t.Helper()
	db, _, waits := openDatabase(t, engine)
	return withReservations(t, explore.New(db, waits.Blocked), db, sink)
}

// openDatabase opens a fresh, migrated database of the engine, closed when
// the test ends, with its URL and the view of its lock waits.
func openDatabase(t *testing.T, engine string) (store.Store, string, *explore.WaitObserver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := testdb.URL(t, engine)
	db, err := store.Open(ctx, url, 8)
	if err != nil {
		t.Fatalf("open %s: %v", engine, err)
	}
	t.Cleanup(db.Close)
	if err := db.Migrate(ctx); err != nil {
		t.Fatalf("migrate %s: %v", engine, err)
	}
	waits, err := explore.ObserveWaits(ctx, url)
	if err != nil {
		t.Fatalf("observe lock waits on %s: %v", engine, err)
	}
	t.Cleanup(waits.Close)
	return db, url, waits
}

// withReservations gives x the reservation stores of redis-reserve and
// redis-watch, on a durable redis-server of the test's own, their writers
// writing into sink(db).
func withReservations(t *testing.T, x *explore.Explorer, db store.Store, sink func(store.Store) reservation.Sink) *explore.Explorer {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testredis.StartDurable(t).Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	for name, opts := range map[string][]reservation.Option{
		strategies.NameRedisReserve: nil,
		strategies.NameRedisWatch:   {reservation.WithOptimisticTransactions(50, 2)},
	} {
		res := reservation.New(rdb, db, opts...)
		consumer := res.NewConsumer(sink(db), reservation.WithConsumerLogger(slog.New(slog.DiscardHandler)))
		x.WithReservations(name, explore.Reservations{Store: res, Sales: db, Write: consumer.WriteOnce})
	}
	return x
}

// seed is EXPLORE_SEED, or a new one each run: the report prints it, so a
// failing sample can be run again.
func seed(t *testing.T) uint64 {
	if s := os.Getenv("EXPLORE_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("EXPLORE_SEED: %v", err)
		}
		return n
	}
	return rand.Uint64()
}

// scaled multiplies a budget by EXPLORE_SCALE (default 1): `make explore`
// runs the same test with a budget many times larger.
func scaled(t *testing.T, n int) int {
	v := os.Getenv("EXPLORE_SCALE")
	if v == "" {
		return n
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		t.Fatalf("EXPLORE_SCALE=%q: want a positive number", v)
	}
	return int(float64(n) * f)
}

// candidate is a strategy as the harness runs it, and whether the harness
// must find it unsafe.
type candidate struct {
	name     string
	strategy func(explore.Env) inventory.Strategic
	faults   explore.Faults
	unsafe   bool
	reserved string // the reservation store it takes orders into, if any
	// stands for the registered strategies this candidate's code runs
	// for (nil: the one named name).
	stands []string
}

// covers lists the registered strategies the candidate stands for.
func (c candidate) covers() []string {
	if c.stands != nil {
		return c.stands
	}
	return []string{c.name}
}

// candidates lists the strategies the harness runs: all of them, or only
// the one EXPLORE_STRATEGY names.
func candidates() []candidate {
	only := os.Getenv("EXPLORE_STRATEGY")
	var cs []candidate
	for _, c := range allCandidates() {
		if only == "" || c.name == only {
			cs = append(cs, c)
		}
	}
	return cs
}

func allCandidates() []candidate {
	commitLost := explore.Faults{Max: 1, LostCommitAnswer: true}
	lockFaults := explore.Faults{Max: 1, LostCommitAnswer: true, LeaseExpiry: true}
	cs := []candidate{
		// The bound on attempts in flight is a throughput device, not a
		// guard: without it every interleaving of the buyers is possible.
		{name: strategies.NameVersionCAS, faults: commitLost,
			strategy: func(explore.Env) inventory.Strategic {
				return sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(0), sqlrow.WithBackoff(0, 0))
			}},
		// Every lock strategy (redis-lock, redlock, etcd-lock, zk-lock,
		// db-lock) runs this same code over its own backend: the scheduler's lock
		// stands for them all, with the faults a backend can show (a lease
		// that expires under a paused holder). The backends themselves are
		// held to that lock's contract by one conformance suite
		// (internal/locking/locktest) against their real servers.
		{name: "redis-lock, redlock, etcd-lock, zk-lock, db-lock", faults: lockFaults, stands: strategies.LockNames,
			strategy: func(env explore.Env) inventory.Strategic {
				return locked.New(strategies.NameRedisLock, env.Locker)
			}},
		// Batches form from the buyers that join the queue while a batch
		// runs; the scheduler picks when each joins.
		{name: strategies.NameBatched, faults: commitLost,
			strategy: func(env explore.Env) inventory.Strategic {
				return batched.New(env.Store, batched.WithQueueObserver(env.Queue),
					batched.WithLogger(slog.New(slog.DiscardHandler)))
			}},
		// Orders are taken by one script in Redis; a writer entity moves
		// them into the database, a batch a step, between the buyers'
		// steps. A lost answer: the script ran, the buyer heard nothing.
		{name: strategies.NameRedisReserve, faults: commitLost, reserved: strategies.NameRedisReserve,
			strategy: func(env explore.Env) inventory.Strategic {
				return reservation.NewReserved(env.Reservations, env.Sales)
			}},
		// The same with WATCH, a read, a check and MULTI/EXEC: one call
		// into the store is still one step here, so the scheduler explores
		// the writer and the lost answers, not the optimistic race itself
		// (EXEC's refusal of a changed key is Redis's own; the race runs
		// in TestReserveRaceThenDrain/redis-watch).
		{name: strategies.NameRedisWatch, faults: commitLost, reserved: strategies.NameRedisWatch,
			strategy: func(env explore.Env) inventory.Strategic {
				return reservation.NewReserved(env.Reservations, env.Sales, reservation.WithReservedName(strategies.NameRedisWatch))
			}},
		// The controls: each must be caught overselling.
		{name: strategies.NameNaive, unsafe: true, faults: commitLost,
			strategy: func(explore.Env) inventory.Strategic { return sqlrow.NewNaive() }},
		// legacy-getset is this code over a lock with no token: the
		// scheduler's lock expires under a paused holder as its does.
		{name: "redis-lock FENCING=off", unsafe: true, faults: lockFaults, stands: []string{strategies.NameLegacyGetset},
			strategy: func(env explore.Env) inventory.Strategic {
				return locked.New(strategies.NameRedisLock, env.Locker, locked.WithFencing(false))
			}},
		{name: "redis-lock, fence without version (before the fix)", unsafe: true, faults: lockFaults, stands: []string{},
			strategy: func(env explore.Env) inventory.Strategic { return fenceOnly{env.Locker} }},
	}
	// The safe strategies that only deduct, as the registry builds them:
	// one transaction per order, whose answer may be lost.
	var registered []candidate
	for _, s := range strategies.All() {
		if s.New == nil || !s.Safe() || slices.ContainsFunc(cs, func(c candidate) bool { return slices.Contains(c.covers(), s.Name) }) {
			continue
		}
		registered = append(registered, candidate{name: s.Name, faults: commitLost,
			strategy: func(explore.Env) inventory.Strategic { return s.New() }})
	}
	return append(registered, cs...)
}

// TestExplorerCoversEveryStrategy: every strategy of the registry is run
// by a candidate of the explorer, the controls as unsafe ones.
func TestExplorerCoversEveryStrategy(t *testing.T) {
	covered := map[string]candidate{}
	for _, c := range allCandidates() {
		for _, name := range c.covers() {
			if _, ok := strategies.Lookup(name); !ok {
				t.Errorf("candidate %q stands for %q, which is not registered", c.name, name)
			}
			covered[name] = c
		}
	}
	for _, s := range strategies.All() {
		c, ok := covered[s.Name]
		switch {
		case !ok:
			t.Errorf("the explorer does not run %s", s.Name)
		case c.unsafe == s.Safe():
			t.Errorf("%s is %s, but the explorer's candidate %q has unsafe=%v", s.Name, s.Class, c.name, c.unsafe)
		}
	}
}

// TestEverySchedule runs every strategy against every schedule of two
// buyers for one unit, and against the schedules of three buyers for two
// units up to a bound plus a seeded random sample, with a fault per
// schedule, on both engines. Safe strategies break no rule in any of them;
// the controls must be caught.
func TestEverySchedule(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			ctx := context.Background()
			s := seed(t)
			for _, c := range candidates() {
				// The controls need only be caught; the safe strategies
				// get the larger budget.
				max3, samples3 := 300, 100
				if c.unsafe {
					max3, samples3 = 100, 50
				}
				for _, shape := range []struct {
					stock      int64
					quantities []int64
					max        int
					samples    int
				}{
					{stock: 1, quantities: []int64{1, 1}, max: scaled(t, 2000)},
					{stock: 2, quantities: []int64{1, 1, 1}, max: scaled(t, max3), samples: scaled(t, samples3)},
				} {
					sc := explore.Scenario{
						Name:         fmt.Sprintf("%s on %s, %d buyers for %d", c.name, engine, len(shape.quantities), shape.stock),
						Stock:        shape.stock,
						Quantities:   shape.quantities,
						Strategy:     c.strategy,
						Faults:       c.faults,
						MaxSchedules: shape.max,
						Samples:      shape.samples,
						Seed:         s,
						Reserved:     c.reserved,
					}
					r, err := x.Explore(ctx, sc)
					if err != nil {
						t.Fatalf("%s: %v", sc.Name, err)
					}
					t.Log(r)
					switch {
					case c.unsafe && len(shape.quantities) == 2 && r.Failed == 0:
						t.Errorf("%s: the harness did not catch the unsafe control", sc.Name)
					case c.unsafe && r.Failed > 0:
						t.Logf("caught, as it must be: %s", r.Failures[0])
					case !c.unsafe:
						for _, f := range r.Failures {
							t.Errorf("%s: %s", sc.Name, f)
						}
					}
				}
			}
		})
	}
}

// TestEveryScheduleOfALimit runs every schedule of one buyer ordering
// twice at once on two instances under PER_USER_LIMIT=1, for the
// reservation strategies, on both engines: their count of the buyer's
// units lives in Redis beside the stock (the other strategies' claim on
// the buyer's row runs in TestEveryLifecycleSchedule). One order at most,
// the other refused limit_reached only when the first was taken, nothing
// oversold.
func TestEveryScheduleOfALimit(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			ctx := context.Background()
			s := seed(t)
			for _, c := range candidates() {
				if c.unsafe || c.reserved == "" {
					continue
				}
				sc := explore.Scenario{
					Name:         fmt.Sprintf("%s on %s, one buyer ordering twice on two instances, PER_USER_LIMIT=1", c.name, engine),
					Stock:        2,
					Quantities:   []int64{1, 1},
					PerUserLimit: 1,
					Instances:    2,
					Strategy:     c.strategy,
					Faults:       c.faults,
					MaxSchedules: scaled(t, 250),
					Samples:      scaled(t, 50),
					Seed:         s,
					Reserved:     c.reserved,
				}
				r, err := x.Explore(ctx, sc)
				if err != nil {
					t.Fatalf("%s: %v", sc.Name, err)
				}
				t.Log(r)
				if r.Schedules == 0 {
					t.Errorf("%s: no schedule ran", sc.Name)
				}
				for _, f := range r.Failures {
					t.Errorf("%s: %s", sc.Name, f)
				}
			}
		})
	}
}

// TestEveryScheduleOfARetry runs every schedule of a request and its retry
// under the same idempotency key — the retry sent while the first attempt is
// still under way, its commit answer possibly lost — for every safe
// strategy on both engines: one order at most, every 201 names it, and no
// attempt is refused when the key's order exists.
func TestEveryScheduleOfARetry(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			ctx := context.Background()
			s := seed(t)
			for _, c := range candidates() {
				if c.unsafe {
					continue
				}
				// Stock 1: the retry can only be refused if its first
				// attempt took the last unit.
				for _, stock := range []int64{1} {
					sc := explore.Scenario{
						Name:         fmt.Sprintf("%s on %s, a request and its retry, stock %d", c.name, engine, stock),
						Stock:        stock,
						Quantities:   []int64{1, 1},
						Retry:        true,
						Strategy:     c.strategy,
						Faults:       c.faults,
						MaxSchedules: scaled(t, 250),
						Samples:      scaled(t, 50),
						Seed:         s,
						Reserved:     c.reserved,
					}
					r, err := x.Explore(ctx, sc)
					if err != nil {
						t.Fatalf("%s: %v", sc.Name, err)
					}
					t.Log(r)
					for _, f := range r.Failures {
						t.Errorf("%s: %s", sc.Name, f)
					}
				}
			}
		})
	}
}

// fenceOnly is the lock strategy's write as it was before the version check:
// the fence is compared and stored at the write, but nothing checks that the
// stock the holder read is still there. The harness must find its oversell.
type fenceOnly struct{ locker locked.Locker }

func (f fenceOnly) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: "fence-only", Deduct: f.Deduct}
}

func (f fenceOnly) Deduct(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
	lease, err := f.locker.Acquire(ctx, sku)
	if err != nil {
		return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	return inTx(lease.Context(), func(ctx context.Context, tx inventory.StockTx) error {
		level, err := tx.ReadLevel(ctx, sku)
		if err != nil {
			return err
		}
		if level.Available < quantity {
			return inventory.ErrSoldOut
		}
		// UPDATE … WHERE fence < token, as the old SQL did: the row's
		// current version, read under its lock, so the version check of
		// DeductIfFenced always passes and only the fence decides.
		now, err := tx.LockLevel(ctx, sku)
		if err != nil {
			return err
		}
		ok, err := tx.DeductIfFenced(ctx, sku, quantity, lease.Token(), now.Version)
		if err == nil && !ok {
			err = inventory.ErrFencedOff
		}
		return err
	})
}

// answersWith is a strategy that takes the lock, reads the stock in a
// transaction, and refuses the order with err, changing nothing.
type answersWith struct {
	locker locked.Locker
	err    error
}

func (a answersWith) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: "answers-with", Deduct: a.Deduct}
}

func (a answersWith) Deduct(ctx context.Context, sku string, _ int64, inTx inventory.TxRunner) error {
	lease, err := a.locker.Acquire(ctx, sku)
	if err != nil {
		return err
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	if err := inTx(lease.Context(), func(ctx context.Context, tx inventory.StockTx) error {
		_, err := tx.ReadLevel(ctx, sku)
		return err
	}); err != nil {
		return err
	}
	return a.err
}

// TestHarnessRefusesUnexplainedAnswers: a fault in a schedule excuses only
// the buyer it struck. A 500 breaks a rule in every schedule, faults or not;
// busy breaks one in every schedule where some buyer's lock did not expire
// (otherwise a harness could excuse every answer once any fault had
// happened anywhere).
func TestHarnessRefusesUnexplainedAnswers(t *testing.T) {
	x := open(t, "postgres")
	for _, err := range []error{errors.New("boom"), inventory.ErrBusy} {
		sc := explore.Scenario{Name: fmt.Sprintf("every buyer answered %v", err), Stock: 1, Quantities: []int64{1, 1},
			Faults:       explore.Faults{Max: 1, LostCommitAnswer: true, LeaseExpiry: true},
			Strategy:     func(env explore.Env) inventory.Strategic { return answersWith{env.Locker, err} },
			MaxSchedules: 1000}
		r, xerr := x.Explore(context.Background(), sc)
		if xerr != nil {
			t.Fatal(xerr)
		}
		t.Log(r)
		// With one fault a schedule, at most one buyer's lock expires:
		// the other's busy is never explained.
		if !r.Exhaustive || r.Schedules < 10 || r.Failed != r.Schedules {
			t.Errorf("%s: %d of %d schedules broke a rule, want all", sc.Name, r.Failed, r.Schedules)
		}
	}
}

// droppingSink takes every batch of orders and writes none: a consumer that
// acknowledges before it has written.
type droppingSink struct{}

func (droppingSink) PersistReservedEach(_ context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	out := make([]reservation.SaleBatchOutcome, len(batches))
	for i, b := range batches {
		out[i].Written = len(b.Orders)
	}
	return out, nil
}

// TestHarnessCatchesAWriterThatLosesOrders: the control of the reservation
// scenarios. With a writer that acknowledges orders without writing them,
// every schedule in which an order is answered 201 must break a rule.
func TestHarnessCatchesAWriterThatLosesOrders(t *testing.T) {
	x := openWith(t, "postgres", func(store.Store) reservation.Sink { return droppingSink{} })
	sc := explore.Scenario{Name: "redis-reserve whose writer drops orders", Stock: 1, Quantities: []int64{1, 1}, Reserved: strategies.NameRedisReserve,
		Faults: explore.Faults{Max: 1, LostCommitAnswer: true},
		Strategy: func(env explore.Env) inventory.Strategic {
			return reservation.NewReserved(env.Reservations, env.Sales)
		},
		MaxSchedules: 100}
	r, err := x.Explore(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if !r.Exhaustive || r.Schedules < 5 || r.Failed != r.Schedules {
		t.Errorf("%s: %d of %d schedules broke a rule, want all", sc.Name, r.Failed, r.Schedules)
	}
	if r.Failed > 0 {
		t.Logf("caught, as it must be: %s", r.Failures[0])
	}
}

// reserveWithoutLimit is a reservation store that forgets the per-user limit of
// every order it is given: the control of the limit's rows.
type reserveWithoutLimit struct{ reservation.Reservations }

func (l reserveWithoutLimit) Reserve(ctx context.Context, r reservation.Reservation) (reservation.Taken, error) {
	r.PerUserLimit = 0
	return l.Reservations.Reserve(ctx, r)
}

// TestHarnessCatchesAReservationPastTheLimit: the control of
// TestEveryScheduleOfALimit. With a store that never checks the limit,
// both orders of the buyer are taken in every schedule, and every
// schedule must break a rule.
func TestHarnessCatchesAReservationPastTheLimit(t *testing.T) {
	x := open(t, "postgres")
	sc := explore.Scenario{Name: "redis-reserve with the limit unchecked", Stock: 2, Quantities: []int64{1, 1}, Reserved: strategies.NameRedisReserve,
		PerUserLimit: 1, Instances: 2,
		Strategy: func(env explore.Env) inventory.Strategic {
			return reservation.NewReserved(reserveWithoutLimit{env.Reservations}, env.Sales)
		},
		MaxSchedules: 100}
	r, err := x.Explore(context.Background(), sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(r)
	if !r.Exhaustive || r.Schedules < 2 || r.Failed != r.Schedules {
		t.Errorf("%s: %d of %d schedules broke a rule, want all", sc.Name, r.Failed, r.Schedules)
	}
	if r.Failed > 0 {
		t.Logf("caught, as it must be: %s", r.Failures[0])
	}
}

// TestBatchesFormInTheSchedule: buyers that join the queue while a batch
// runs go into the next batch together, and the harness runs that batch's
// transaction as its leader's steps. A takes 1 of 2 units alone; B and C
// join meanwhile, and B leads their batch: its statement locks the row
// (skipping it, were it held), deducts nothing (2 > 1) and returns the
// row as it locked it: 1 left. A second statement deducts B's unit, and C
// is sold out.
func TestBatchesFormInTheSchedule(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			x := open(t, engine)
			sc := explore.Scenario{Name: "batched", Stock: 2, Quantities: []int64{1, 1, 1},
				Strategy: func(env explore.Env) inventory.Strategic {
					return batched.New(env.Store, batched.WithQueueObserver(env.Queue),
						batched.WithLogger(slog.New(slog.DiscardHandler)))
				}}
			steps := []string{"A: join the batch queue", "B: join the batch queue", "C: join the batch queue",
				"A: write", "A: commit", "B: write", "B: write", "B: commit"}
			run, err := x.Replay(context.Background(), sc, steps)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"created", "created", "sold_out"}
			if !slices.Equal(run.Outcomes, want) || !slices.Equal(run.Schedule, steps) || run.Audit.Available != 0 || len(run.Problems) > 0 {
				t.Errorf("answers %v (want %v), %d left, problems %v\n    schedule: %s",
					run.Outcomes, want, run.Audit.Available, run.Problems, strings.Join(run.Schedule, " → "))
			}
		})
	}
}
