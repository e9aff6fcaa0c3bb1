package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// sale is one test's service over a durable private Redis and a database of
// its own.
type sale struct {
	t     *testing.T
	redis *testredis.Server
	rdb   *redis.Client
	db    store.Store
	res   *reservation.Store
	svc   *sales.Service
	seen  *written
}

// mode is how orders are taken: the script (redis-reserve) or WATCH and
// MULTI/EXEC (redis-watch).
type mode struct {
	name string
	opts []reservation.Option
}

var modes = []mode{
	{strategies.NameRedisReserve, nil},
	{strategies.NameRedisWatch, []reservation.Option{reservation.WithOptimisticTransactions(50, 2)}},
}

// forEachMode runs f as a subtest for each mode.
func forEachMode(t *testing.T, f func(t *testing.T, m mode)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { f(t, m) })
	}
}

// newSale is newSaleIn with the script.
func newSale(t *testing.T, engine string) *sale { return newSaleIn(t, engine, modes[0]) }

func newSaleIn(t *testing.T, engine string, m mode) *sale {
	t.Helper()
	srv := testredis.StartDurable(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	db := testdb.New(t, engine, 8)
	res := reservation.New(rdb, db, m.opts...)
	return &sale{t: t, redis: srv, rdb: rdb, db: db, res: res,
		svc: sales.NewService(db, reservation.NewReserved(res, db, reservation.WithReservedName(m.name))), seen: newWritten()}
}

// consume runs a consumer until the test ends; its batches are counted in
// s.seen.
func (s *sale) consume(sink reservation.Sink, opts ...reservation.ConsumerOption) {
	s.t.Helper()
	c := s.res.NewConsumer(sink, append([]reservation.ConsumerOption{reservation.WithConsumerObserver(s.seen)}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	s.t.Cleanup(func() { cancel(); <-done })
}

func (s *sale) start(sku string, n int64) {
	s.t.Helper()
	if err := s.svc.StartSale(context.Background(), sku, n); err != nil {
		s.t.Fatalf("start sale: %v", err)
	}
}

func (s *sale) order(sku string, q int64, user, key string) (inventory.Order, error) {
	return s.svc.PlaceOrder(context.Background(), inventory.Request{SKU: sku, Quantity: q, UserID: user, IdempotencyKey: key})
}

// drained waits until the database holds n orders of the sale (counted by
// the consumers' observer), then returns the database's own audit.
func (s *sale) drained(sku string, n int64) inventory.Audit {
	s.t.Helper()
	s.seen.waitFor(s.t, n)
	a, err := s.db.Audit(context.Background(), sku)
	if err != nil {
		s.t.Fatal(err)
	}
	return a
}

// counter counts events and wakes whoever waits for a number of them.
type counter struct {
	mu     sync.Mutex
	n      int64
	change chan struct{}
}

func newCounter() *counter { return &counter{change: make(chan struct{})} }

func (c *counter) add(k int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += k
	close(c.change)
	c.change = make(chan struct{})
}

// now returns the count and a channel closed at the next change.
func (c *counter) now() (int64, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.change
}

// waitFor waits until the count reaches n, for at most 30 seconds; what
// names the events in the failure.
func (c *counter) waitFor(t *testing.T, n int64, what string) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		have, change := c.now()
		if have >= n {
			return
		}
		select {
		case <-change:
		case <-deadline.C:
			t.Fatalf("%d %s in 30s, want %d", have, what, n)
		}
	}
}

// written counts the orders the consumers wrote, and the batches they
// failed to write (reservation.Observer).
type written struct {
	orders, failures *counter
}

func newWritten() *written { return &written{orders: newCounter(), failures: newCounter()} }

func (w *written) Written(_ string, lags []time.Duration) { w.orders.add(int64(len(lags))) }
func (w *written) Failed(string)                          { w.failures.add(1) }

func (w *written) waitFor(t *testing.T, n int64) {
	t.Helper()
	w.orders.waitFor(t, n, "orders written by the consumers")
}

// TestReserveRaceThenDrain: 200 buyers race for 50 units through Redis; the
// answers, Redis's tally and, once the consumers have written every order,
// the database all agree, with three consumers sharing the stream.
func TestReserveRaceThenDrain(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) { raceThenDrain(t, m) })
}

func raceThenDrain(t *testing.T, m mode) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			s := newSaleIn(t, engine, m)
			for range 3 {
				s.consume(s.db)
			}
			const sku, initial = "reserve-race", 50
			s.start(sku, initial)
			var (
				wg             sync.WaitGroup
				mu             sync.Mutex
				sold, orders   int64
				minRefused     = int64(1 << 62)
				ids            = map[string]bool{}
				start          = make(chan struct{})
				unexpectedErrs []error
			)
			for i := range 200 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					q := int64(i%3 + 1)
					<-start
					o, err := s.order(sku, q, fmt.Sprintf("u-%d", i), "")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						sold += q
						orders++
						ids[o.ID] = true
					case errors.Is(err, inventory.ErrSoldOut):
						minRefused = min(minRefused, q)
					default:
						unexpectedErrs = append(unexpectedErrs, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			if len(unexpectedErrs) > 0 {
				t.Fatalf("%d unexpected errors, first: %v", len(unexpectedErrs), unexpectedErrs[0])
			}
			audit, err := s.svc.Audit(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			if audit.Orders != orders || audit.Ordered != sold || !audit.Consistent() || audit.Available < 0 {
				t.Errorf("answers: %d orders for %d units; audit %+v", orders, sold, audit)
			}
			if audit.Available >= minRefused {
				t.Errorf("%d units left, yet a request for %d was told sold out", audit.Available, minRefused)
			}
			db := s.drained(sku, orders)
			if db.Orders != orders || db.Ordered != sold || db.Available != initial-sold || !db.Consistent() {
				t.Errorf("after the drain the database has %+v, want %d orders for %d units", db, orders, sold)
			}
			for id := range ids {
				if _, found, err := s.db.FindOrder(context.Background(), id); err != nil || !found {
					t.Errorf("order %s answered 201 is not in the database (found %v, %v)", id, found, err)
				}
			}
			after, err := s.svc.Audit(context.Background(), sku)
			if err != nil {
				t.Fatal(err)
			}
			if after.Pending != 0 || !after.Consistent() {
				t.Errorf("drained audit %+v: want nothing pending, consistent", after)
			}
		})
	}
}

// TestNoOversellByOne: the script's comparison at the edge: the last unit
// sells, the next request and a request for more than is left do not.
func TestNoOversellByOne(t *testing.T) {
	forEachMode(t, noOversellByOne)
}

func noOversellByOne(t *testing.T, m mode) {
	s := newSaleIn(t, "postgres", m)
	s.start("edge", 2)
	if _, err := s.order("edge", 3, "a", ""); !errors.Is(err, inventory.ErrSoldOut) {
		t.Fatalf("3 of 2: %v, want sold out", err)
	}
	if _, err := s.order("edge", 2, "b", ""); err != nil {
		t.Fatalf("2 of 2: %v", err)
	}
	if _, err := s.order("edge", 1, "c", ""); !errors.Is(err, inventory.ErrSoldOut) {
		t.Fatalf("1 of 0: %v, want sold out", err)
	}
	l, err := s.svc.Level(context.Background(), "edge")
	if err != nil || l.Available != 0 {
		t.Fatalf("level %+v %v, want 0 left", l, err)
	}
}

// TestIdempotencyInRedis: a retry with the same key gets the first order and
// takes nothing more; the key with another body is a conflict; the database
// gets one order and one key record.
func TestIdempotencyInRedis(t *testing.T) {
	forEachMode(t, idempotencyInRedis)
}

func idempotencyInRedis(t *testing.T, m mode) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			s := newSaleIn(t, engine, m)
			s.consume(s.db)
			s.start("idem", 10)
			first, err := s.order("idem", 2, "u", "k-1")
			if err != nil {
				t.Fatal(err)
			}
			again, err := s.order("idem", 2, "u", "k-1")
			if err != nil || again.ID != first.ID {
				t.Fatalf("retry: %+v %v, want order %s", again, err, first.ID)
			}
			if _, err := s.order("idem", 3, "u", "k-1"); !errors.Is(err, inventory.ErrIdempotencyConflict) {
				t.Fatalf("same key, another body: %v, want a conflict", err)
			}
			db := s.drained("idem", 1)
			if db.Orders != 1 || db.Ordered != 2 || db.Available != 8 {
				t.Fatalf("database %+v, want one order of 2", db)
			}
		})
	}
}

// TestLostAnswerTakesStockOnce: the same call run twice (its first answer
// lost) takes the stock once and logs the order once.
func TestLostAnswerTakesStockOnce(t *testing.T) {
	forEachMode(t, lostAnswerTakesStockOnce)
}

func lostAnswerTakesStockOnce(t *testing.T, m mode) {
	s := newSaleIn(t, "postgres", m)
	s.start("lost", 5)
	r := reservation.Reservation{Order: inventory.Order{ID: "0193e7a4-0000-7000-8000-000000000001", SKU: "lost", Quantity: 2, UserID: "u", Strategy: strategies.NameRedisReserve}}
	for range 2 {
		taken, err := s.res.Reserve(context.Background(), r)
		if err != nil || taken.OrderID != r.Order.ID {
			t.Fatalf("reserve: %q %v", taken.OrderID, err)
		}
	}
	tally, err := s.res.Tally(context.Background(), "lost")
	if err != nil {
		t.Fatal(err)
	}
	if tally.Available != 3 || tally.Orders != 1 || tally.Pending != 1 {
		t.Fatalf("tally %+v, want 3 left, one order pending", tally)
	}
}

// TestReplayWritesNothing: a batch delivered twice (its consumer died
// after the commit, before the acknowledgement) writes nothing the second
// time.
func TestReplayWritesNothing(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 4)
			epoch, err := db.StartSaleWith(ctx, inventory.SaleStart{SKU: "replay", Available: 10})
			if err != nil {
				t.Fatal(err)
			}
			orders := []inventory.Order{
				{ID: "0193e7a4-0000-7000-8000-000000000001", SKU: "replay", Quantity: 2, UserID: "a", Strategy: strategies.NameRedisReserve},
				{ID: "0193e7a4-0000-7000-8000-000000000002", SKU: "replay", Quantity: 3, UserID: "b", Strategy: strategies.NameRedisReserve},
			}
			keys := []inventory.IdempotencyRecord{{Key: "k", SKU: "replay", RequestHash: []byte{1}, OrderID: orders[1].ID}}
			for i, want := range []int{2, 0} {
				n, err := db.PersistReserved(ctx, "replay", epoch, orders, keys)
				if err != nil || n != want {
					t.Fatalf("delivery %d wrote %d (%v), want %d", i+1, n, err, want)
				}
			}
			// A delivery that overlaps the first: only the new order.
			more := append(orders, inventory.Order{ID: "0193e7a4-0000-7000-8000-000000000003", SKU: "replay", Quantity: 1, UserID: "c", Strategy: strategies.NameRedisReserve})
			if n, err := db.PersistReserved(ctx, "replay", epoch, more, nil); err != nil || n != 1 {
				t.Fatalf("overlapping delivery wrote %d (%v), want 1", n, err)
			}
			a, err := db.Audit(ctx, "replay")
			if err != nil || a.Orders != 3 || a.Ordered != 6 || a.Available != 4 || !a.Consistent() {
				t.Fatalf("audit %+v %v, want 3 orders of 6 units, 4 left", a, err)
			}
			if _, err := db.PersistReserved(ctx, "replay", epoch-1, more, nil); !errors.Is(err, inventory.ErrStaleSale) {
				t.Fatalf("orders of an older sale: %v, want ErrStaleSale", err)
			}
		})
	}
}

// TestRestartedSaleDropsItsOldOrders: orders still in the stream when the
// sale is restarted never reach the new sale's rows.
func TestRestartedSaleDropsItsOldOrders(t *testing.T) {
	s := newSale(t, "mysql")
	s.start("again", 10)
	for i := range 3 {
		if _, err := s.order("again", 1, fmt.Sprintf("old-%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	// A consumer that read the old sale's orders but had not written them
	// when the sale restarted: they stay pending in its name.
	stream := "stock:{again}:orders"
	read, err := s.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: reservation.Group, Consumer: "slow", Streams: []string{stream, ">"}, Count: 10, Block: -1}).Result()
	if err != nil || len(read[0].Messages) != 3 {
		t.Fatalf("read the old orders: %v %v", read, err)
	}
	s.start("again", 10)
	if _, err := s.order("again", 4, "new", ""); err != nil {
		t.Fatal(err)
	}
	s.consume(s.db)
	db := s.drained("again", 1)
	if db.Orders != 1 || db.Ordered != 4 || db.Available != 6 || db.Initial != 10 {
		t.Fatalf("database %+v, want only the new sale's order", db)
	}
	// The old orders went with the old stream; writing them directly is
	// refused as stale.
	epochs, err := s.res.Tally(context.Background(), "again")
	if err != nil {
		t.Fatal(err)
	}
	old := inventory.Order{ID: "0193e7a4-0000-7000-8000-0000000000aa", SKU: "again", Quantity: 1, UserID: "old", Strategy: strategies.NameRedisReserve}
	if _, err := s.db.PersistReserved(context.Background(), "again", epochs.Epoch-1, []inventory.Order{old}, nil); !errors.Is(err, inventory.ErrStaleSale) {
		t.Fatalf("an old sale's order: %v, want ErrStaleSale", err)
	}
}

// TestDeadConsumersOrdersAreClaimed: orders read by a consumer that died
// before writing them are claimed by another after the idle bound and
// written once.
func TestDeadConsumersOrdersAreClaimed(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			s := newSale(t, engine)
			s.start("claim", 20)
			for i := range 5 {
				if _, err := s.order("claim", 2, fmt.Sprintf("u-%d", i), ""); err != nil {
					t.Fatal(err)
				}
			}
			read, err := s.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{Group: reservation.Group, Consumer: "dead", Streams: []string{"stock:{claim}:orders", ">"}, Count: 10, Block: -1}).Result()
			if err != nil || len(read[0].Messages) != 5 {
				t.Fatalf("the dead consumer's read: %v %v", read, err)
			}
			s.consume(s.db, reservation.WithClaimIdle(50*time.Millisecond))
			db := s.drained("claim", 5)
			if db.Orders != 5 || db.Ordered != 10 || db.Available != 10 {
				t.Fatalf("database %+v, want the dead consumer's 5 orders", db)
			}
			// The consumer acknowledges after its commit: the rows may be
			// there a moment before the acknowledgement.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			deadline := time.After(5 * time.Second)
			for {
				pending, err := s.rdb.XPending(context.Background(), "stock:{claim}:orders", reservation.Group).Result()
				if err == nil && pending.Count == 0 {
					break
				}
				select {
				case <-tick.C: // polling Redis's state: no event to wait on
				case <-deadline:
					t.Fatalf("pending after the claim: %+v %v", pending, err)
				}
			}
		})
	}
}

// flakySink fails its first writes, as a database that is down does.
type flakySink struct {
	reservation.Sink
	mu    sync.Mutex
	fails int
}

func (f *flakySink) PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	f.mu.Lock()
	fail := f.fails > 0
	f.fails--
	f.mu.Unlock()
	if fail {
		return nil, fmt.Errorf("%w: database down (test)", inventory.ErrUnavailable)
	}
	return f.Sink.PersistReservedEach(ctx, batches)
}

// TestDatabaseDownOrdersWait: while the database refuses writes, orders are
// still accepted and wait in the stream; they land once it takes them.
func TestDatabaseDownOrdersWait(t *testing.T) {
	s := newSale(t, "postgres")
	s.start("down", 10)
	s.consume(&flakySink{Sink: s.db, fails: 3})
	for i := range 4 {
		if _, err := s.order("down", 1, fmt.Sprintf("u-%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	db := s.drained("down", 4)
	if db.Orders != 4 || db.Available != 6 {
		t.Fatalf("database %+v, want 4 orders", db)
	}
	failed, _ := s.seen.failures.now()
	if failed < 1 {
		t.Fatalf("the sink refused 3 writes, the observer saw %d failures", failed)
	}
}

// TestWipedRedisFailsClosed: a Redis that lost its data has no sale: orders
// get 503 and nothing is sold from the empty key, until the sale is
// started again. A Redis restarted with its AOF keeps everything.
func TestWipedRedisFailsClosed(t *testing.T) {
	s := newSale(t, "postgres")
	s.start("wipe", 5)
	if _, err := s.order("wipe", 2, "a", ""); err != nil {
		t.Fatal(err)
	}
	s.redis.Stop()
	s.redis.Restart(t)
	// The restarted Redis is checked against the database, which has no
	// more orders than Redis accepted: it keeps selling.
	if _, err := s.order("wipe", 1, "after-restart", ""); err != nil {
		t.Fatalf("order after a restart with the AOF: %v", err)
	}
	tally, err := s.res.Tally(context.Background(), "wipe")
	if err != nil || tally.Available != 2 || tally.Pending != 2 {
		t.Fatalf("after a restart with the AOF: %+v %v, want 2 left and 2 pending", tally, err)
	}
	s.redis.Wipe(t)
	_, err = s.order("wipe", 1, "b", "")
	if !errors.Is(err, inventory.ErrUnavailable) || !errors.Is(err, reservation.ErrSaleNotLoaded) {
		t.Fatalf("order on a wiped Redis: %v, want 503 (sale not loaded)", err)
	}
	if _, err := s.svc.Audit(context.Background(), "wipe"); !errors.Is(err, inventory.ErrUnavailable) {
		t.Fatalf("audit on a wiped Redis: %v, want unavailable", err)
	}
	if _, err := s.order("never-started", 1, "b", ""); !errors.Is(err, inventory.ErrUnknownSKU) {
		t.Fatalf("an unknown SKU: %v, want unknown", err)
	}
	s.start("wipe", 5)
	if _, err := s.order("wipe", 1, "c", ""); err != nil {
		t.Fatalf("after the sale restarted: %v", err)
	}
}

// TestCheckDurable refuses a Redis without an fsynced append-only file.
func TestCheckDurable(t *testing.T) {
	ctx := context.Background()
	durable := testredis.StartDurable(t)
	if err := reservation.CheckDurable(ctx, durable.Client(t)); err != nil {
		t.Fatalf("durable server refused: %v", err)
	}
	for _, args := range [][]string{nil, {"--appendonly", "yes", "--appendfsync", "everysec"}} {
		err := reservation.CheckDurable(ctx, testredis.Start(t, args...).Client(t))
		if !errors.Is(err, reservation.ErrNotDurable) {
			t.Errorf("redis-server %v: %v, want ErrNotDurable", args, err)
		}
	}
	if err := reservation.CheckNoEviction(ctx, durable.Client(t)); err != nil {
		t.Fatalf("noeviction server refused: %v", err)
	}
	lru := testredis.StartDurable(t, "--maxmemory-policy", "allkeys-lru")
	if err := reservation.CheckNoEviction(ctx, lru.Client(t)); !errors.Is(err, reservation.ErrNotDurable) {
		t.Errorf("allkeys-lru: %v, want ErrNotDurable", err)
	}
}

// TestLoadIsNotUndoneByARetry: loading the loaded sale again keeps the
// orders taken since; an older sale is refused.
func TestLoadIsNotUndoneByARetry(t *testing.T) {
	s := newSale(t, "postgres")
	ctx := context.Background()
	if err := s.res.Load(ctx, "load", 10, 7, inventory.SaleWindow{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.res.Reserve(ctx, reservation.Reservation{Order: inventory.Order{ID: "o1", SKU: "load", Quantity: 4, UserID: "u"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.res.Load(ctx, "load", 10, 7, inventory.SaleWindow{}); err != nil {
		t.Fatal(err)
	}
	if err := s.res.Load(ctx, "load", 10, 6, inventory.SaleWindow{}); err == nil {
		t.Fatal("an older sale was loaded over a newer one")
	}
	tally, err := s.res.Tally(ctx, "load")
	if err != nil || tally.Available != 6 || tally.Epoch != 7 {
		t.Fatalf("tally %+v %v, want sale 7 with 6 left", tally, err)
	}
}

// TestNewSaleEntriesSortAfterOldOnes: a new sale's stream entries get ids
// above every entry of the old sale, so a consumer that acknowledges and
// deletes old entries by id after the restart cannot hit a new one. (An
// entry with an id far in the future stands for an old entry taken in the
// same millisecond as the new sale's first.)
func TestNewSaleEntriesSortAfterOldOnes(t *testing.T) {
	s := newSale(t, "postgres")
	ctx := context.Background()
	s.start("ids", 5)
	stream := "stock:{ids}:orders"
	const future = "9999999999999-0"
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: future, Values: []string{"id", "old"}}).Err(); err != nil {
		t.Fatal(err)
	}
	s.start("ids", 5)
	if _, err := s.order("ids", 1, "u", ""); err != nil {
		t.Fatal(err)
	}
	entries, err := s.rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil || len(entries) != 1 {
		t.Fatalf("the new sale's stream: %v %v, want its one order", entries, err)
	}
	if entries[0].ID <= future {
		t.Fatalf("the new sale's entry %s does not sort after the old sale's %s", entries[0].ID, future)
	}
}

// droppingSink takes batches without writing them: a consumer that
// acknowledges before it has written.
type droppingSink struct{}

func (droppingSink) PersistReservedEach(_ context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	out := make([]reservation.SaleBatchOutcome, len(batches))
	for i, b := range batches {
		out[i].Written = len(b.Orders)
	}
	return out, nil
}

// TestAuditFindsOrdersLostOnTheirWay: once nothing is pending, the database
// must hold every accepted order; the audit reports drift when it does not.
func TestAuditFindsOrdersLostOnTheirWay(t *testing.T) {
	s := newSale(t, "postgres")
	s.consume(droppingSink{})
	s.start("lost-way", 5)
	if _, err := s.order("lost-way", 2, "u", ""); err != nil {
		t.Fatal(err)
	}
	s.seen.waitFor(t, 1)
	a, err := s.svc.Audit(context.Background(), "lost-way")
	if err != nil {
		t.Fatal(err)
	}
	if a.Consistent() || a.Drift == "" || a.Pending != 0 {
		t.Fatalf("audit %+v: want drift (nothing pending, the order not in the database)", a)
	}
	t.Log(a.Drift)
}
