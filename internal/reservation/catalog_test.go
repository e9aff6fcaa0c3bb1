package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testredis"
)

// A catalog on sale: many SKUs, few of them ordered. What a restart of
// Redis or an idle consumer costs must follow the SKUs being ordered, not
// the catalog.

const catalogKey = "stock:reserve:catalog"

// countingLedger is the real database as a reservation.Ledger that counts
// the sales a check of Redis looked at.
type countingLedger struct {
	store.Store
	checked atomic.Int64
}

func (l *countingLedger) RecheckSale(ctx context.Context, sku string, check func(context.Context, reservation.SaleRecheck) error) error {
	l.checked.Add(1)
	return l.Store.RecheckSale(ctx, sku, check)
}

// startCatalog puts n SKUs named prefix-i on sale, units each, eight at a
// time, and returns their names.
func startCatalog(t *testing.T, s *sale, prefix string, n int, units int64) []string {
	t.Helper()
	skus := make([]string, n)
	for i := range skus {
		skus[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	work := make(chan string)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for sku := range work {
				if err := s.svc.StartSale(context.Background(), sku, units); err != nil {
					errs <- fmt.Errorf("start %s: %w", sku, err)
				}
			}
		})
	}
	for _, sku := range skus {
		work <- sku
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return skus
}

// orderWithin places one order that must be answered within d.
func (s *sale) orderWithin(d time.Duration, sku, user string) (inventory.Order, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: user})
}

// TestRestartedRedisHasANewReplicationID pins what the restart check rests
// on: a master that restarts, from its append-only file, takes a new
// replication id, so every sale it holds was checked under another one and
// is checked again on its next order. A Redis that kept its id across a
// restart would sell a rolled-back copy unchecked: this test fails first.
func TestRestartedRedisHasANewReplicationID(t *testing.T) {
	srv := testredis.StartDurable(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	replid := func() string {
		t.Helper()
		info, err := rdb.Info(ctx, "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(info, "master_replid:")
		id, _, _ := strings.Cut(rest, "\r\n")
		if id == "" {
			t.Fatalf("no master_replid in INFO replication: %q", info)
		}
		return id
	}
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := replid()
	srv.Stop()
	srv.Restart(t)
	if v, err := rdb.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("the AOF did not bring the data back: %q %v", v, err)
	}
	if after := replid(); after == before {
		t.Fatalf("the restarted master kept its replication id %s", before)
	}
}

// TestRestartChecksOnlyTheSKUsOrdered: with a catalog on sale, the first
// order after a Redis restart is answered (within its deadline; the time is
// logged: tens of milliseconds on a quiet machine), and the restart costs
// one check of the SKU being ordered, not one of every SKU on sale.
// (Before, the first order after a restart checked every SKU ever listed
// within its own deadline; from about 2,000 SKUs no pass finished and the
// shop answered 503 until it was restarted.)
func TestRestartChecksOnlyTheSKUsOrdered(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		ledger := &countingLedger{Store: s.db}
		withLedger(s, m, ledger)
		s.consume(s.db)
		skus := startCatalog(t, s, "catalog", 400, 5)
		hot, warm := skus[7], skus[301]
		for i, sku := range []string{hot, warm} {
			if _, err := s.order(sku, 1, fmt.Sprintf("before-%d", i), ""); err != nil {
				t.Fatal(err)
			}
		}

		s.redis.Stop()
		s.redis.Restart(t)

		begun := time.Now()
		if _, err := s.orderWithin(3*time.Second, hot, "after-hot"); err != nil {
			t.Fatalf("first order after the restart, %d SKUs on sale: %v", len(skus), err)
		}
		t.Logf("first order after the restart answered in %v, %d SKUs on sale", time.Since(begun), len(skus))
		if n := ledger.checked.Load(); n != 1 {
			t.Fatalf("the restart cost %d checks for one SKU ordered, want 1", n)
		}
		for i, sku := range []string{hot, warm, skus[399]} {
			if _, err := s.orderWithin(3*time.Second, sku, fmt.Sprintf("later-%d", i)); err != nil {
				t.Fatalf("order of %s after the restart: %v", sku, err)
			}
		}
		if n := ledger.checked.Load(); n != 3 {
			t.Fatalf("%d checks after orders of 3 SKUs, want 3 (one each, once)", n)
		}
		for sku, want := range map[string]int64{hot: 3, warm: 2, skus[399]: 1} {
			if a := waitWritten(t, s, sku, want); a.Ordered != want || a.Available != 5-want {
				t.Errorf("%s: %+v, want %d sold", sku, a, want)
			}
		}
	})
}

// waitWritten waits until the database holds want units of sku's sale
// (the consumers' observer counts every batch), then returns its audit.
func waitWritten(t *testing.T, s *sale, sku string, want int64) inventory.Audit {
	t.Helper()
	for {
		have, change := s.seen.orders.now()
		a, err := s.db.Audit(context.Background(), sku)
		if err != nil {
			t.Fatal(err)
		}
		if a.Ordered >= want {
			return a
		}
		select {
		case <-change:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: %d of %d units written after 30s (%d orders written in all)", sku, a.Ordered, want, have)
		}
	}
}

// commands counts the commands a client sends, by name, pipelined or not.
type commands struct {
	mu    sync.Mutex
	count map[string]int
	total *counter
}

func newCommands() *commands { return &commands{count: map[string]int{}, total: newCounter()} }

func (c *commands) add(cmds ...redis.Cmder) {
	n := 0
	c.mu.Lock()
	for _, cmd := range cmds {
		switch cmd.Name() {
		case "hello", "client":
			// A new connection's handshake, not work.
		default:
			c.count[cmd.Name()]++
			n++
		}
	}
	c.mu.Unlock()
	if n > 0 {
		c.total.add(int64(n))
	}
}

func (c *commands) of(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[name]
}

func (c *commands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(cmd); return next(ctx, cmd) }
}
func (c *commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(cmds...); return next(ctx, cmds) }
}

// waitCommand waits until the client has sent n commands of that name.
func (c *commands) waitCommand(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		_, change := c.total.now()
		if c.of(name) >= n {
			return
		}
		select {
		case <-change:
		case <-deadline:
			t.Fatalf("%d %s commands in 30s, want %d", c.of(name), name, n)
		}
	}
}

// quiet fails when the client sends any command during d. Idleness is
// what is under test, so this waits out d.
func (c *commands) quiet(t *testing.T, d time.Duration, what string) {
	t.Helper()
	before, _ := c.total.now()
	<-time.After(d)
	if after, _ := c.total.now(); after != before {
		c.mu.Lock()
		defer c.mu.Unlock()
		t.Fatalf("%s: %d commands in %v, want none (by name, since the start: %v)", what, after-before, d, c.count)
	}
}

// TestIdleConsumerSendsNothing: with 10,000 SKUs in the catalog and no
// orders, a consumer reads one page of the catalog (a thousand SKUs, one
// round trip) per sweep period and nothing else until an order of its
// process wakes it; once that order is written its stream leaves the
// working set and the consumer is quiet again. (At first an idle consumer
// read every listed SKU's stream every 10 ms: 14,000 XREADGROUP a second
// with 10,000 SKUs; then its sweep walked the whole catalog every 10 s:
// 2,000 commands a second, and Redis spent 0.7% of a core on them.)
func TestIdleConsumerSendsNothing(t *testing.T) {
	s := newSale(t, "postgres")
	ctx := context.Background()
	const listed = 10_000
	members := make([]redis.Z, listed)
	for i := range members {
		members[i] = redis.Z{Score: 1, Member: fmt.Sprintf("idle-%05d", i)}
	}
	if err := s.rdb.ZAdd(ctx, catalogKey, members...).Err(); err != nil {
		t.Fatal(err)
	}

	sent := newCommands()
	crdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	crdb.AddHook(sent)
	t.Cleanup(func() { _ = crdb.Close() })
	res := reservation.New(crdb, s.db)
	s.svc = sales.NewService(s.db, reservation.NewReserved(res, s.db))
	c := res.NewConsumer(s.db, reservation.WithConsumerObserver(s.seen), reservation.WithSweep(time.Hour))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// One page, then nothing for the rest of the hour.
	sent.waitCommand(t, "zscan", 1)
	sent.waitCommand(t, "xlen", 1) // the page's pipeline
	sent.quiet(t, 300*time.Millisecond, "idle, after the sweep's page")
	// ZSCAN's COUNT is a hint: about a thousand.
	if n, m := sent.of("zscan"), sent.of("xlen"); n != 1 || m < 500 || m > 2000 {
		t.Errorf("the sweep read %d pages and looked at %d streams, want one page of about 1000", n, m)
	}

	s.start("idle-wake", 5)
	before := sent.of("xlen")
	if _, err := s.order("idle-wake", 1, "buyer", ""); err != nil {
		t.Fatal(err)
	}
	s.seen.waitFor(t, 1)
	// The round after the write finds the stream empty and drops it.
	sent.waitCommand(t, "xlen", before+2)
	sent.quiet(t, 300*time.Millisecond, "idle, after the order was written")
}

// TestSweepWritesTheOrdersOfADeadInstance: an instance takes orders and
// dies before its consumer reads them; a consumer in another process, which
// never took an order of that SKU, finds the stream on its sweep and
// writes them.
func TestSweepWritesTheOrdersOfADeadInstance(t *testing.T) {
	s := newSale(t, "postgres") // the instance that dies: no consumer
	const sku = "orphaned"
	s.start(sku, 5)
	for i := range 3 {
		if _, err := s.order(sku, 1, fmt.Sprintf("u%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	other := reservation.New(s.rdb, s.db)
	c := other.NewConsumer(s.db, reservation.WithConsumerObserver(s.seen), reservation.WithSweep(20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if a := s.drained(sku, 3); a.Ordered != 3 || a.Available != 2 {
		t.Fatalf("after the sweep: %+v, want 3 sold, 2 left", a)
	}
}

// TestFinishedSaleLeavesTheCatalog: a sale sold out and drained leaves the
// catalog, so sweeps and reconciliations stop paying for it; one with stock
// left stays, and starting the finished SKU again lists it again.
// TestSweepPagesReachTheEndOfTheCatalog: the orders a dead instance left
// on the catalog's last SKU are found by a sweep that reads the catalog a
// page at a time, past SKUs without a sale and SKUs that leave the
// catalog on the way (sold out and drained).
func TestSweepPagesReachTheEndOfTheCatalog(t *testing.T) {
	s := newSale(t, "postgres") // the instance that dies: no consumer
	ctx := context.Background()
	// Ten listed SKUs ahead of the orphan: even ones without a sale, odd
	// ones sold out and drained (they leave the catalog when swept).
	for i := range 10 {
		sku := fmt.Sprintf("ahead-%02d", i)
		if i%2 == 0 {
			if err := s.rdb.ZAdd(ctx, catalogKey, redis.Z{Score: 1, Member: sku}).Err(); err != nil {
				t.Fatal(err)
			}
			continue
		}
		s.start(sku, 1)
		if _, err := s.order(sku, 1, "early", ""); err != nil {
			t.Fatal(err)
		}
	}
	drainer := reservation.New(s.rdb, s.db).NewConsumer(s.db, reservation.WithConsumerObserver(s.seen), reservation.WithSweep(time.Hour))
	for i := 1; i < 10; i += 2 {
		if _, err := drainer.WriteOnce(ctx, fmt.Sprintf("ahead-%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	const sku = "orphaned"
	s.start(sku, 5)
	for i := range 3 {
		if _, err := s.order(sku, 1, fmt.Sprintf("u%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	if last, err := s.rdb.ZRange(ctx, catalogKey, -1, -1).Result(); err != nil || len(last) != 1 || last[0] != sku {
		t.Fatalf("the catalog's last SKU is %v (%v), want %q", last, err, sku)
	}

	other := reservation.New(s.rdb, s.db)
	c := other.NewConsumer(s.db, reservation.WithConsumerObserver(s.seen),
		reservation.WithSweep(20*time.Millisecond), reservation.WithSweepPage(2))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if a := s.drained(sku, 5+3); a.Ordered != 3 || a.Available != 2 {
		t.Fatalf("after the sweep: %+v, want 3 sold, 2 left", a)
	}
	for i := 1; i < 10; i += 2 {
		if _, err := s.rdb.ZScore(ctx, catalogKey, fmt.Sprintf("ahead-%02d", i)).Result(); !errors.Is(err, redis.Nil) {
			t.Errorf("ahead-%02d, sold out and drained, is still in the catalog (%v)", i, err)
		}
	}
}

func TestFinishedSaleLeavesTheCatalog(t *testing.T) {
	s := newSale(t, "postgres")
	sweeps := newCommands()
	crdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	crdb.AddHook(sweeps)
	t.Cleanup(func() { _ = crdb.Close() })
	c := reservation.New(crdb, s.db).NewConsumer(s.db, reservation.WithConsumerObserver(s.seen), reservation.WithSweep(20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	s.start("finished", 2)
	s.start("selling", 5)
	for i, sku := range []string{"finished", "finished", "selling"} {
		if _, err := s.order(sku, 1, fmt.Sprintf("u%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.order("finished", 1, "late", ""); !errors.Is(err, inventory.ErrSoldOut) {
		t.Fatalf("order after the last unit: %v, want sold out", err)
	}
	s.seen.waitFor(t, 3)
	// Two sweeps after the last write: the second began after the stream
	// was empty.
	sweeps.waitCommand(t, "zscan", sweeps.of("zscan")+2)
	if _, err := s.rdb.ZScore(ctx, catalogKey, "finished").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("the sold-out, drained sale is still in the catalog (%v)", err)
	}
	if _, err := s.rdb.ZScore(ctx, catalogKey, "selling").Result(); err != nil {
		t.Errorf("the sale with stock left is not in the catalog: %v", err)
	}
	s.start("finished", 4)
	if _, err := s.rdb.ZScore(ctx, catalogKey, "finished").Result(); err != nil {
		t.Errorf("the SKU started again is not in the catalog: %v", err)
	}
	if _, err := s.order("finished", 1, "again", ""); err != nil {
		t.Fatalf("order of the sale started again: %v", err)
	}
}
