package reservation_test

// Adversarial review of the per-user limit and the sale windows in Redis
// (redis-reserve and redis-watch). The findings, fixed since, replay the
// schedules that broke a claim; the rest pin schedules
// under which the claim holds.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// redisNow reads Redis's clock (TIME), the clock the windows are checked on.
func redisNow(t *testing.T, rdb redis.Cmdable) time.Time {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// streamEntries reads the SKU's unwritten orders (no consumer runs).
func streamEntries(t *testing.T, rdb redis.Cmdable, sku string) []redis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), "stock:{"+sku+"}:orders", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func entryMillis(t *testing.T, m redis.XMessage) int64 {
	t.Helper()
	ms, err := strconv.ParseInt(strings.SplitN(m.ID, "-", 2)[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// Found by review, fixed (windowBound): A window whose end is at or before
// the Unix epoch (1970-01-01T00:00:00Z, or any time in 1969) passes
// Validate (only ends > starts is checked, and a zero StartsAt is no
// bound), the database records it as a sale that ended long ago, but Load
// writes ends = UnixMilli() = 0 (or a negative number), which the reserve
// script and outsideWindow read as "no end": Redis takes orders of a sale
// that ended 56 years ago. The same input through a SQL strategy is refused
// (ends_at <= statement_timestamp()). Schedule:
// StartSaleWindow(ends_at=1970-01-01Z), PlaceOrder.
func TestWindowEndedAtOrBeforeUnixEpochStillSells(t *testing.T) {
	t.Run("for-update (the SQL reference)", func(t *testing.T) {
		db := testdb.New(t, "postgres", 4)
		svc := sales.NewService(db, sqlrow.NewForUpdate())
		ctx := context.Background()
		if err := svc.StartSaleWindow(ctx, "epoch-end", 10, inventory.SaleWindow{EndsAt: time.Unix(0, 0).UTC()}); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "epoch-end", Quantity: 1, UserID: "late"}); !errors.Is(err, inventory.ErrSaleEnded) {
			t.Errorf("for-update: %v, want sale_ended", err)
		}
	})
	for _, end := range []time.Time{time.Unix(0, 0).UTC(), time.Date(1969, 7, 20, 20, 17, 0, 0, time.UTC)} {
		forEachMode(t, func(t *testing.T, m mode) {
			s := newSaleIn(t, "postgres", m)
			ctx := context.Background()
			sku := "epoch-end"
			w := inventory.SaleWindow{EndsAt: end}
			if err := w.Validate(); err != nil {
				t.Skipf("the window is refused now: %v", err)
			}
			if err := s.svc.StartSaleWindow(ctx, sku, 10, w); err != nil {
				t.Skipf("a sale ending at %s is refused now: %v", end, err)
			}
			_, err := s.order(sku, 1, "late", "")
			if !errors.Is(err, inventory.ErrSaleEnded) {
				t.Errorf("an order in a sale that ended at %s: %v, want sale_ended", end.Format(time.RFC3339), err)
			}
			if n := len(streamEntries(t, s.rdb, sku)); n != 0 {
				t.Errorf("%d orders taken in a sale that ended at %s", n, end.Format(time.RFC3339))
			}
		})
	}
}

// Found by review, fixed (the window in microseconds): Load stores starts
// as UnixMilli(StartsAt), truncated, and the scripts compare Redis's TIME
// truncated to the millisecond: a StartsAt with a sub-millisecond part (the
// API takes RFC 3339 with fractions, Postgres and MariaDB keep
// microseconds) opens the sale up to 999 µs early on Redis's own clock.
// Schedule: StartsAt = M + 999 µs for a millisecond M ahead; poll TIME
// until it reads M; place an order; TIME read after the answer is still
// before StartsAt, yet the order was taken (the bound should be rounded up:
// ceil for starts).
func TestWindowOpensUpToAMillisecondEarly(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		ctx := context.Background()
		for attempt := range 20 {
			sku := fmt.Sprintf("early-%d", attempt)
			now := redisNow(t, s.rdb)
			startMs := now.Add(300 * time.Millisecond).UnixMilli()
			starts := time.UnixMilli(startMs).Add(999 * time.Microsecond).UTC()
			if err := s.svc.StartSaleWindow(ctx, sku, 10, inventory.SaleWindow{StartsAt: starts}); err != nil {
				t.Fatal(err)
			}
			// Time itself is under test: wait on Redis's clock for the
			// millisecond in which the window opens.
			deadline := time.Now().Add(5 * time.Second)
			for redisNow(t, s.rdb).UnixMilli() < startMs {
				if time.Now().After(deadline) {
					t.Fatal("Redis's clock did not reach the window's start")
				}
				time.Sleep(100 * time.Microsecond)
			}
			_, err := s.order(sku, 1, "early-bird", "")
			after := redisNow(t, s.rdb)
			switch {
			case err == nil && after.Before(starts):
				t.Errorf("order taken with Redis's clock at most at %s, before the sale starts at %s (%v early at least)",
					after.Format(time.RFC3339Nano), starts.Format(time.RFC3339Nano), starts.Sub(after))
				return
			case err == nil:
				// Taken, but the answer came after starts: inconclusive.
				continue
			case errors.Is(err, inventory.ErrSaleNotStarted):
				// Refused: holds for this attempt.
				continue
			default:
				t.Fatal(err)
			}
		}
		t.Log("no attempt took an order before starts")
	})
}

// execHold delays every EXEC until release returns.
type execHold struct {
	armed   atomic.Bool
	release func()
	held    atomic.Int32
}

func (h *execHold) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *execHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *execHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.armed.Load() {
			for _, c := range cmds {
				if c.Name() == "exec" {
					h.held.Add(1)
					h.release()
					break
				}
			}
		}
		return next(ctx, cmds)
	}
}

// Found by review, fixed (the watched open key): redis-watch decides the
// window on the TIME read in its WATCH pipeline and applies the order at
// EXEC: an EXEC sent late (a GC pause, a slow network, a descheduled
// instance: here a hook holds it until Redis's clock passes ends) is
// applied after the sale ended. The order is then taken at/after ends on
// Redis's clock: its stream entry id (Redis's clock at XADD, the "accepted"
// time the consumer reports) is >= ends. Nothing in WATCH catches it: time
// touches no watched key. The script cannot do this (TIME and the decrement
// are one atomic step); the SQL strategies decide on statement_timestamp()
// in the same statement that decrements. The code's comment accepts it ("a
// read inside the window decides even if EXEC lands a little later"), but
// the claim is "no order is taken at/after ends (Redis's clock)", and "a
// little" is unbounded: up to the order's deadline (30 s by default).
// Observable: a read of the sale's books a second after it ended (orders)
// changes later. A fix that keeps WATCH: Load also sets a key {S}:open with
// PEXPIREAT ends; redis-watch WATCHes it and requires it at the read. Redis
// fails EXEC when a watched key expired since WATCH (multi.c,
// isWatchedKeyExpired), so the EXEC that lands at/after ends applies
// nothing and the retry reads "ended". (starts needs no such key: EXEC is
// never earlier than the read.)
func TestWatchExecAfterEndsTakesTheOrder(t *testing.T) {
	s := newSaleIn(t, "postgres", modes[1])
	ctx := context.Background()
	sku := "late-exec"
	ends := redisNow(t, s.rdb).Add(300 * time.Millisecond)
	if err := s.svc.StartSaleWindow(ctx, sku, 10, inventory.SaleWindow{EndsAt: ends}); err != nil {
		t.Fatal(err)
	}
	clock := testredisClient(t, s.redis)
	closedOrders := int64(-1)
	h := &execHold{release: func() {
		// Time itself is under test: hold the EXEC until Redis's clock
		// reads a second past ends.
		deadline := time.Now().Add(5 * time.Second)
		for redisNow(t, clock).Before(ends.Add(time.Second)) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		// The books of the ended sale, as anyone reads them now.
		closedOrders, _ = clock.HGet(ctx, "stock:{"+sku+"}:sale", "orders").Int64()
	}}
	s.rdb.AddHook(h)
	h.armed.Store(true)
	order, err := s.order(sku, 1, "late", "")
	h.armed.Store(false)
	if h.held.Load() == 0 {
		t.Fatal("no EXEC was held")
	}
	if err != nil {
		t.Logf("refused: %v (the claim holds)", err)
		return
	}
	if after, _ := clock.HGet(ctx, "stock:{"+sku+"}:sale", "orders").Int64(); after != closedOrders {
		t.Errorf("the sale's orders read a second after it ended: %d; later: %d", closedOrders, after)
	}
	for _, m := range streamEntries(t, s.rdb, sku) {
		if m.Values["id"] == order.ID {
			if at := entryMillis(t, m); at >= ends.UnixMilli() {
				t.Errorf("order %s answered 201 and taken at %d ms on Redis's clock, at/after the sale's end %d ms (%d ms late)",
					order.ID, at, ends.UnixMilli(), at-ends.UnixMilli())
			}
			return
		}
	}
	t.Errorf("order %s answered 201 but not in the stream", order.ID)
}

func testredisClient(t *testing.T, srv *testredis.Server) *redis.Client { return srv.Client(t) }

// HOLDS. Lost answers under the limit: Redis is stopped (SIGSTOP) while a
// buyer's order is in flight; the client times out and sends the script
// again on new connections, several times; then Redis resumes and runs
// every copy. The first takes the units and counts them, the others find
// the order's placed key: one entry in the stream, the buyer counted once,
// and the buyer's next orders are refused or taken by the true count.
func TestLostAnswersAreCountedOnce(t *testing.T) {
	for _, pipelines := range []int{0, 4} {
		for _, m := range modes {
			t.Run(fmt.Sprintf("%s/pipelines=%d", m.name, pipelines), func(t *testing.T) {
				srv := testredis.StartDurable(t)
				rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true,
					ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond})
				t.Cleanup(func() { _ = rdb.Close() })
				cmds := newCommands()
				rdb.AddHook(cmds)
				st := reservation.New(rdb, nil, append([]reservation.Option{reservation.WithPipelines(pipelines)}, m.opts...)...)
				ctx := context.Background()
				sku := "lost"
				if err := st.Load(ctx, sku, 100, 1<<20, inventory.SaleWindow{}); err != nil {
					t.Fatal(err)
				}
				reserve := func(id string, q int64) error {
					ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
					defer cancel()
					_, err := st.Reserve(ctx, reservation.Reservation{Order: inventory.Order{ID: id, SKU: sku, Quantity: q, UserID: "u", Strategy: m.name}, PerUserLimit: 3})
					return err
				}
				name := "evalsha"
				if m.name == strategies.NameRedisWatch {
					name = "exec"
				}
				if err := reserve("warm", 1); err != nil { // connections and script loaded
					t.Fatal(err)
				}
				before := cmds.of(name)
				if m.name == strategies.NameRedisWatch {
					// Stop Redis right as EXEC goes out: its answer is
					// lost, the retries WATCH again on new connections.
					var once sync.Once
					h := &execHold{release: func() { once.Do(func() { _ = srv.Pause() }) }}
					h.armed.Store(true)
					rdb.AddHook(h)
					defer h.armed.Store(false)
				} else if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- reserve("lost-1", 2) }()
				if m.name == strategies.NameRedisWatch {
					cmds.waitCommand(t, "watch", 4)
				} else {
					cmds.waitCommand(t, name, before+3)
				}
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatalf("the order whose answers were lost: %v", err)
				}
				if err := reserve("over", 1); !errors.Is(err, inventory.ErrLimitReached) {
					t.Errorf("a 4th unit under a limit of 3: %v, want limit_reached", err)
				}
				var units int64
				seen := map[string]int{}
				for _, e := range streamEntries(t, rdb, sku) {
					seen[fmt.Sprint(e.Values["id"])]++
					q, _ := strconv.ParseInt(fmt.Sprint(e.Values["q"]), 10, 64)
					units += q
				}
				if seen["lost-1"] != 1 || seen["over"] != 0 || units != 3 {
					t.Errorf("stream: %v (%d units), want warm and lost-1 once each, 3 units", seen, units)
				}
				counted, err := rdb.HGet(ctx, "stock:{"+sku+"}:buyers", "u").Int64()
				if err != nil || counted != 3 {
					t.Errorf("buyer counted %d units (%v), want 3", counted, err)
				}
			})
		}
	}
}

// HOLDS. Three instances on one Redis (the script alone, the script in
// pipelines, WATCH/MULTI/EXEC) take 8 buyers' orders of 1 or 2 units at
// once under a limit of 3, a few with repeated idempotency keys: for every
// buyer the units in the stream are at most 3 and equal the count in
// {S}:buyers, and the stock went down by exactly the units in the stream.
func TestMixedInstancesNeverPassTheLimit(t *testing.T) {
	srv := testredis.StartDurable(t)
	ctx := context.Background()
	const limit, buyers, perBuyer, stock = 3, 8, 12, 1000
	var stores []*reservation.Store
	var names []string
	for i, opts := range [][]reservation.Option{
		{reservation.WithPipelines(0)},
		{reservation.WithPipelines(4)},
		{reservation.WithOptimisticTransactions(200, 0)},
	} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		stores = append(stores, reservation.New(rdb, nil, opts...))
		names = append(names, []string{strategies.NameRedisReserve, strategies.NameRedisReserve, strategies.NameRedisWatch}[i])
	}
	sku := "mixed"
	if err := stores[0].Load(ctx, sku, stock, 1<<20, inventory.SaleWindow{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := map[string]int64{} // order ids answered 201 (or replays) -> units
	for b := range buyers {
		for i := range perBuyer {
			wg.Go(func() {
				st := stores[(b+i)%len(stores)]
				q := int64(1 + rand.IntN(2))
				id := fmt.Sprintf("o-%d-%d", b, i)
				key := ""
				if i%4 == 0 {
					key = fmt.Sprintf("k-%d", b) // replays of one key
					q = 1
				}
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				got, err := st.Reserve(cctx, reservation.Reservation{
					Order: inventory.Order{ID: id, SKU: sku, Quantity: q, UserID: fmt.Sprintf("b%d", b), Strategy: names[(b+i)%len(stores)]},
					Key:   key, Fingerprint: []byte(key), PerUserLimit: limit})
				switch {
				case err == nil:
					mu.Lock()
					answered[got.OrderID] = q
					mu.Unlock()
				case errors.Is(err, inventory.ErrLimitReached), errors.Is(err, inventory.ErrBusy):
				default:
					t.Errorf("order %s: %v", id, err)
				}
			})
		}
	}
	wg.Wait()
	rdb := srv.Client(t)
	perUser := map[string]int64{}
	var total int64
	for _, e := range streamEntries(t, rdb, sku) {
		q, _ := strconv.ParseInt(fmt.Sprint(e.Values["q"]), 10, 64)
		perUser[fmt.Sprint(e.Values["u"])] += q
		total += q
		if _, ok := answered[fmt.Sprint(e.Values["id"])]; !ok {
			t.Errorf("order %v in the stream was never answered 201", e.Values["id"])
		}
	}
	counts, err := rdb.HGetAll(ctx, "stock:{"+sku+"}:buyers").Result()
	if err != nil {
		t.Fatal(err)
	}
	for b := range buyers {
		u := fmt.Sprintf("b%d", b)
		c, _ := strconv.ParseInt(counts[u], 10, 64)
		if perUser[u] > limit || c != perUser[u] {
			t.Errorf("buyer %s: %d units in the stream, counted %d, limit %d", u, perUser[u], c, limit)
		}
	}
	avail, err := rdb.HGet(ctx, "stock:{"+sku+"}:sale", "available").Int64()
	if err != nil || avail != stock-total {
		t.Errorf("available %d (%v), want %d", avail, err, stock-total)
	}
}

// HOLDS. The limit through a kill -9 and restart of Redis from its AOF
// under load: two instances (the script in pipelines, and WATCH) take 6
// buyers' orders of 1 or 2 units under a limit of 5 while Redis is killed
// with scripts in flight and restarted; answers are lost (outcome unknown),
// the sale is checked against the database and renumbered, consumers
// drain. Afterwards every order id tried is looked up in the database: no
// buyer holds more than 5 units there, every 201 is there, and Redis's
// count of each buyer equals the buyer's units in the database.
func TestLimitHoldsThroughAKillAndRestart(t *testing.T) {
	const limit, buyers, tries = 5, 6, 25
	srv := testredis.StartDurable(t)
	db := testdb.New(t, "postgres", 8)
	ctx := context.Background()
	var stores []*reservation.Store
	var svc *sales.Service
	names := []string{strategies.NameRedisReserve, strategies.NameRedisWatch}
	for i, opts := range [][]reservation.Option{{reservation.WithPipelines(4)}, {reservation.WithOptimisticTransactions(100, 0)}} {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		st := reservation.New(rdb, db, opts...)
		stores = append(stores, st)
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = st.NewConsumer(db).Run(cctx) }()
		t.Cleanup(func() { cancel(); <-done })
		if i == 0 {
			svc = sales.NewService(db, reservation.NewReserved(st, db))
		}
	}
	sku := "killed"
	if err := svc.StartSale(ctx, sku, 1000); err != nil {
		t.Fatal(err)
	}
	type try struct {
		id, user string
		q        int64
		err      error
	}
	var mu sync.Mutex
	var all []try
	taken := newCounter()
	var wg sync.WaitGroup
	for b := range buyers {
		for i, st := range stores {
			wg.Go(func() {
				for range tries {
					tr := try{id: uuid.NewString(), user: fmt.Sprintf("b%d", b), q: int64(1 + rand.IntN(2))}
					cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
					_, tr.err = st.Reserve(cctx, reservation.Reservation{
						Order:        inventory.Order{ID: tr.id, SKU: sku, Quantity: tr.q, UserID: tr.user, Strategy: names[i]},
						PerUserLimit: limit})
					cancel()
					mu.Lock()
					all = append(all, tr)
					mu.Unlock()
					if tr.err == nil {
						taken.add(1)
					}
				}
			})
		}
	}
	taken.waitFor(t, 6, "orders taken")
	srv.Stop()
	srv.Restart(t)
	wg.Wait()
	// Drain: poll the tally until nothing is pending (10 s at most).
	deadline := time.Now().Add(15 * time.Second)
	for {
		tl, err := stores[0].Tally(ctx, sku)
		if err == nil && tl.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v %v", tl, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the consumers' progress
	}
	inDB := map[string]int64{}
	unknown, ok := 0, 0
	for _, tr := range all {
		o, found, err := db.FindOrder(ctx, tr.id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case tr.err == nil && !found:
			t.Errorf("order %s answered 201 is not in the database", tr.id)
		case tr.err != nil && found && !errors.Is(tr.err, inventory.ErrOutcomeUnknown):
			t.Errorf("order %s refused (%v) is in the database", tr.id, tr.err)
		}
		if tr.err == nil {
			ok++
		} else if errors.Is(tr.err, inventory.ErrOutcomeUnknown) {
			unknown++
		}
		if found {
			inDB[o.UserID] += o.Quantity
		}
	}
	rdb := srv.Client(t)
	counts, err := rdb.HGetAll(ctx, "stock:{"+sku+"}:buyers").Result()
	if err != nil {
		t.Fatal(err)
	}
	for b := range buyers {
		u := fmt.Sprintf("b%d", b)
		c, _ := strconv.ParseInt(counts[u], 10, 64)
		if inDB[u] > limit || c != inDB[u] {
			t.Errorf("buyer %s: %d units in the database, %d counted in Redis, limit %d", u, inDB[u], c, limit)
		}
	}
	t.Logf("%d tries: %d taken, %d unknown; per buyer in the database %v", len(all), ok, unknown, inDB)
}

// Found by review, fixed (the window in microseconds; redis-watch closes up
// to a millisecond early by design): ends is truncated too, so the sale
// closes up to 999 µs before EndsAt on Redis's clock: an order inside the
// window is refused "ended". Schedule: EndsAt = M + 999 µs; poll TIME until
// it reads M; place an order: refused sale_ended, and TIME read after the
// answer is still before EndsAt.
func TestWindowClosesUpToAMillisecondEarly(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		ctx := context.Background()
		for attempt := range 20 {
			sku := fmt.Sprintf("late-%d", attempt)
			now := redisNow(t, s.rdb)
			endMs := now.Add(300 * time.Millisecond).UnixMilli()
			ends := time.UnixMilli(endMs).Add(999 * time.Microsecond).UTC()
			if err := s.svc.StartSaleWindow(ctx, sku, 10, inventory.SaleWindow{EndsAt: ends}); err != nil {
				t.Fatal(err)
			}
			// Time itself is under test.
			deadline := time.Now().Add(5 * time.Second)
			for redisNow(t, s.rdb).UnixMilli() < endMs {
				if time.Now().After(deadline) {
					t.Fatal("Redis's clock did not reach the window's end")
				}
				time.Sleep(100 * time.Microsecond)
			}
			_, err := s.order(sku, 1, "last-call", "")
			after := redisNow(t, s.rdb)
			switch {
			case errors.Is(err, inventory.ErrSaleEnded) && m.name == strategies.NameRedisWatch && !after.Before(ends.Add(-time.Millisecond)):
				// redis-watch's open key expires in whole milliseconds,
				// rounded down: it closes up to a millisecond early by
				// design, so that a late EXEC never sells after the end.
				continue
			case errors.Is(err, inventory.ErrSaleEnded) && after.Before(ends):
				t.Errorf("order refused as ended with Redis's clock at most at %s, before the sale ends at %s",
					after.Format(time.RFC3339Nano), ends.Format(time.RFC3339Nano))
				return
			case err == nil, errors.Is(err, inventory.ErrSaleEnded):
				continue // taken in time, or refused after ends: inconclusive
			default:
				t.Fatal(err)
			}
		}
		t.Log("no attempt was refused before ends")
	})
}

// HOLDS. The window survives a kill and restart of Redis from its AOF and
// the check that renumbers the sale: before starts the order is refused
// (after the check), inside the window it is taken, at ends it is refused.
func TestWindowSurvivesARestartAndItsCheck(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		ctx := context.Background()
		sku := "window-restart"
		now := redisNow(t, s.rdb)
		w := inventory.SaleWindow{StartsAt: now.Add(time.Second).Truncate(time.Millisecond), EndsAt: now.Add(2 * time.Second).Truncate(time.Millisecond)}
		if err := s.svc.StartSaleWindow(ctx, sku, 10, w); err != nil {
			t.Fatal(err)
		}
		s.redis.Stop()
		s.redis.Restart(t)
		// The first order after the restart checks and renumbers the sale.
		var err error
		deadline := time.Now().Add(5 * time.Second)
		for {
			_, err = s.order(sku, 1, "u", "")
			if !errors.Is(err, inventory.ErrUnavailable) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond) // polling a server that is starting
		}
		if !errors.Is(err, inventory.ErrSaleNotStarted) {
			t.Fatalf("before starts, after the restart: %v", err)
		}
		if e, _ := s.rdb.HGet(ctx, "stock:{"+sku+"}:sale", "epoch").Int64(); e%(1<<20) == 0 {
			t.Errorf("the sale was not renumbered by a check (epoch %d)", e)
		}
		waitRedis(t, s.rdb, w.StartsAt)
		if _, err := s.order(sku, 1, "u", ""); err != nil {
			t.Errorf("inside the window: %v", err)
		}
		waitRedis(t, s.rdb, w.EndsAt)
		if _, err := s.order(sku, 1, "v", ""); !errors.Is(err, inventory.ErrSaleEnded) {
			t.Errorf("at ends: %v, want sale_ended", err)
		}
		if n := len(streamEntries(t, s.rdb, sku)); n != 1 {
			t.Errorf("%d orders in the stream, want 1", n)
		}
	})
}

// waitRedis waits (time is under test) until Redis's clock reads at least at.
func waitRedis(t *testing.T, rdb redis.Cmdable, at time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for redisNow(t, rdb).Before(at) {
		if time.Now().After(deadline) {
			t.Fatal("Redis's clock did not get there")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// HOLDS. The limit on a three-master Redis Cluster through a kill and
// restart of a master under load: 6 SKUs spread over the masters, 4 buyers
// each ordering every SKU from two instances (the script in pipelines, and
// WATCH) under a limit of 3, master 1 killed and restarted with its AOF
// once 10 orders are in. Once drained, every order id tried is looked up in
// the database: per SKU and buyer at most 3 units, equal to Redis's count,
// and every 201 is there.
func TestClusterLimitThroughAMasterRestart(t *testing.T) {
	const limit, buyers, skus, tries = 3, 4, 6, 8
	ctx := context.Background()
	cluster := testredis.StartCluster(t, 3)
	db := testdb.New(t, "postgres", 8)
	var stores []*reservation.Store
	names := []string{strategies.NameRedisReserve, strategies.NameRedisWatch}
	seen := newWritten()
	for _, opts := range [][]reservation.Option{{reservation.WithPipelines(4)}, {reservation.WithOptimisticTransactions(100, 0)}} {
		st := reservation.New(cluster.Client(t), db, opts...)
		stores = append(stores, st)
		c := st.NewConsumer(db, reservation.WithConsumerObserver(seen), reservation.WithClaimIdle(time.Second))
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(cctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	svc := sales.NewService(db, reservation.NewReserved(stores[0], db))
	for i := range skus {
		if err := svc.StartSale(ctx, fmt.Sprintf("cl-%d", i), 1000); err != nil {
			t.Fatal(err)
		}
	}
	type try struct {
		id, sku, user string
		err           error
	}
	var mu sync.Mutex
	var all []try
	taken := newCounter()
	var wg sync.WaitGroup
	for b := range buyers {
		for k := range skus {
			for i, st := range stores {
				wg.Go(func() {
					for range tries {
						tr := try{id: uuid.NewString(), sku: fmt.Sprintf("cl-%d", k), user: fmt.Sprintf("b%d", b)}
						cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						_, tr.err = st.Reserve(cctx, reservation.Reservation{
							Order:        inventory.Order{ID: tr.id, SKU: tr.sku, Quantity: 1, UserID: tr.user, Strategy: names[i]},
							PerUserLimit: limit})
						cancel()
						mu.Lock()
						all = append(all, tr)
						mu.Unlock()
						if tr.err == nil {
							taken.add(1)
						}
					}
				})
			}
		}
	}
	taken.waitFor(t, 10, "orders taken")
	cluster.Masters[1].Stop()
	cluster.Masters[1].Restart(t)
	wg.Wait()
	cluster.WaitOK(t)
	for i := range skus {
		waitPendingZero(t, svc, seen, fmt.Sprintf("cl-%d", i))
	}
	inDB := map[[2]string]int64{}
	ok, unknown := 0, 0
	for _, tr := range all {
		o, found, err := db.FindOrder(ctx, tr.id)
		if err != nil {
			t.Fatal(err)
		}
		if tr.err == nil {
			ok++
			if !found {
				t.Errorf("order %s answered 201 is not in the database", tr.id)
			}
		} else if errors.Is(tr.err, inventory.ErrOutcomeUnknown) {
			unknown++
		} else if found {
			t.Errorf("order %s refused (%v) is in the database", tr.id, tr.err)
		}
		if found {
			inDB[[2]string{o.SKU, o.UserID}] += o.Quantity
		}
	}
	cc := cluster.Client(t)
	for k := range skus {
		sku := fmt.Sprintf("cl-%d", k)
		counts, err := cc.HGetAll(ctx, "stock:{"+sku+"}:buyers").Result()
		if err != nil {
			t.Fatal(err)
		}
		for b := range buyers {
			u := fmt.Sprintf("b%d", b)
			c, _ := strconv.ParseInt(counts[u], 10, 64)
			if n := inDB[[2]string{sku, u}]; n > limit || n != c {
				t.Errorf("%s, buyer %s: %d units in the database, %d counted in Redis, limit %d", sku, u, n, c, limit)
			}
		}
	}
	t.Logf("%d tries: %d taken, %d unknown", len(all), ok, unknown)
}

// HOLDS. Replays under the limit and after the end: a buyer at the limit
// through key K gets K's order again (not limit_reached), before and after
// the sale ends; a new key is refused (limit, then ended); nothing more is
// taken.
func TestReplaysAtTheLimitAndAfterTheEnd(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		srv := testredis.StartDurable(t)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		st := reservation.New(rdb, nil, m.opts...)
		ctx := context.Background()
		sku := "replay"
		ends := redisNow(t, rdb).Add(500 * time.Millisecond)
		if err := st.Load(ctx, sku, 10, 1<<20, inventory.SaleWindow{EndsAt: ends}); err != nil {
			t.Fatal(err)
		}
		reserve := func(id, key string, q int64) (string, error) {
			taken, err := st.Reserve(ctx, reservation.Reservation{Order: inventory.Order{ID: id, SKU: sku, Quantity: q, UserID: "u", Strategy: m.name},
				Key: key, Fingerprint: []byte(fmt.Sprint("fp-", q)), PerUserLimit: 2})
			return taken.OrderID, err
		}
		if id, err := reserve("first", "K", 2); err != nil || id != "first" {
			t.Fatalf("first: %s %v", id, err)
		}
		if id, err := reserve("again", "K", 2); err != nil || id != "first" {
			t.Errorf("K's replay at the limit: %s %v, want first", id, err)
		}
		if _, err := reserve("more", "L", 1); !errors.Is(err, inventory.ErrLimitReached) {
			t.Errorf("a new key at the limit: %v", err)
		}
		waitRedis(t, rdb, ends)
		if id, err := reserve("late", "K", 2); err != nil || id != "first" {
			t.Errorf("K's replay after the end: %s %v, want first", id, err)
		}
		if _, err := reserve("late2", "M", 1); !errors.Is(err, inventory.ErrSaleEnded) {
			t.Errorf("a new key after the end: %v, want sale_ended", err)
		}
		if n := len(streamEntries(t, rdb, sku)); n != 1 {
			t.Errorf("%d orders taken, want 1", n)
		}
	})
}
