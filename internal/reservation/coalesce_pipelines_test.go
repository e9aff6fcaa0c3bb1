package reservation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/lab/testredis"
)

// What the coalescer's pipelines carry and how long they hold their
// callers: a caller's answer waits on one pipeline at most, never on two
// pipelines of other people's orders; on Redis Cluster a healthy master's
// order is never held by a hung master's in the same pipeline; and the
// leaders of a hung master's pipelines come back at their orders' deadline,
// not at the client's socket timeouts, so orders for other SKUs are not
// refused behind them.

// gate holds every EVALSHA (alone or in a pipeline) until the test lets it
// go, and says which caller sent it (from the context's value).
type gate struct {
	trips chan *trip
	open  atomic.Bool
}

type trip struct {
	leader  string
	ids     []string
	release chan struct{}
	once    sync.Once
}

func (tr *trip) let() { tr.once.Do(func() { close(tr.release) }) }

type callerID struct{}

func (g *gate) hold(ctx context.Context, cmds []redis.Cmder) {
	if g.open.Load() {
		return
	}
	tr := &trip{release: make(chan struct{})}
	tr.leader, _ = ctx.Value(callerID{}).(string)
	for _, cmd := range cmds {
		if cmd.Name() != "evalsha" {
			return
		}
		tr.ids = append(tr.ids, fmt.Sprint(cmd.Args()[7])) // ARGV[1], the order id
	}
	g.trips <- tr
	<-tr.release
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.hold(ctx, []redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.hold(ctx, cmds)
		return next(ctx, cmds)
	}
}

func (g *gate) next(t *testing.T) *trip {
	t.Helper()
	select {
	case tr := <-g.trips:
		return tr
	case <-time.After(10 * time.Second):
		t.Fatal("no pipeline started in 10 s")
		return nil
	}
}

// Every pipeline carries its leader's own script, also for a caller that
// leads while more than a pipeline's worth of orders queue before it: a
// caller never sends other people's orders without its own, so its answer
// waits on one pipeline at most.
func TestCoalescerLeaderSendsItsOwnScript(t *testing.T) {
	srv := testredis.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: 30 * time.Second, PoolSize: 16})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := reserveScript.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	g := &gate{trips: make(chan *trip, 16)}
	rdb.AddHook(g)
	c := newCoalescer(rdb, 3, &Store{})
	c.changed = make(chan struct{}, 1)
	keys := unloadedKeys(c)

	var wg sync.WaitGroup
	errs := make(chan error, 2000)
	start := func(id string) {
		wg.Go(func() {
			ctx := context.WithValue(context.Background(), callerID{}, id)
			reply, err := c.run(ctx, testSKU, keys, []any{id, 1, "u", "", "", 60000, "redis-reserve"})
			if err == nil && (len(reply) != 1 || reply[0] != "unloaded") {
				err = fmt.Errorf("reply %q", reply)
			}
			if err != nil {
				errs <- fmt.Errorf("%s: %w", id, err)
			}
		})
	}
	var trips []*trip
	check := func(tr *trip) {
		t.Helper()
		trips = append(trips, tr)
		if !slices.Contains(tr.ids, tr.leader) {
			t.Errorf("%s sent a pipeline of %d orders without its own", tr.leader, len(tr.ids))
		}
		if len(tr.ids) > c.maxBatch {
			t.Errorf("%s sent %d orders in one pipeline, more than %d", tr.leader, len(tr.ids), c.maxBatch)
		}
	}

	// Three pipelines out (the test plays their leaders), 512 orders
	// queued behind them.
	playLeaders(c, 3)
	for i := range 512 {
		start(fmt.Sprintf("f%d", i))
	}
	waitFor(t, c, func() bool { return queued(c) == 512 })
	// Two pipelines return together: the first tells the oldest order to
	// lead, the second finds it told already and ends. A pipeline is free.
	c.mu.Lock()
	c.handOnLocked(testSKU, lineOf(c, testSKU))
	c.handOnLocked(testSKU, lineOf(c, testSKU))
	c.mu.Unlock()
	check(g.next(t))
	waitFor(t, c, func() bool { return leading(c) == 2 && queued(c) == 256 })
	// X arrives and leads, with 256 orders queued before it.
	start("x")
	tx := g.next(t)
	check(tx)
	if len(tx.ids) != c.maxBatch || tx.ids[len(tx.ids)-1] != "x" {
		t.Errorf("x's pipeline: %d orders, the last %q; want the 255 oldest and x", len(tx.ids), tx.ids[len(tx.ids)-1])
	}
	// Let everything through; every pipeline is checked the same way.
	endTurn(c)
	for _, tr := range trips {
		tr.let()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case tr := <-g.trips:
			check(tr)
			tr.let()
		case <-done:
			waiting = false
		}
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	idle(t, c)
}

// hungCluster is a three-master cluster whose first master is paused
// (SIGSTOP), two SKUs on sale (one on the paused master, one on another)
// and a Store over it with n pipelines.
func hungCluster(t *testing.T, n int) (st *Store, onHung, healthy string, resume func()) {
	ctx := context.Background()
	cluster := testredis.StartCluster(t, 3)
	cc := cluster.Client(t)
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return reserveScript.Load(ctx, m).Err()
	}); err != nil {
		t.Fatal(err)
	}
	hung := cluster.Masters[0]
	st = New(cc, nil, WithPipelines(n))
	for i := 0; onHung == "" || healthy == ""; i++ {
		sku := fmt.Sprintf("r-%d", i)
		m, err := cc.MasterForKey(ctx, st.keys(sku).sale)
		if err != nil {
			t.Fatal(err)
		}
		if m.Options().Addr == hung.Addr {
			onHung = sku
		} else {
			healthy = sku
		}
	}
	for _, sku := range []string{onHung, healthy} {
		if err := st.Load(ctx, sku, 100, saleStride, inventory.SaleWindow{}); err != nil {
			t.Fatal(err)
		}
	}
	st.pipelines.changed = make(chan struct{}, 1)
	// A cluster client's first pipeline loads the commands' descriptions
	// (COMMAND) from some master: from the paused one it would wait for
	// the socket timeout. Load them now.
	if _, err := cc.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Exists(ctx, st.keys(healthy).sale).Err() }); err != nil {
		t.Fatal(err)
	}
	if err := hung.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hung.Resume() })
	return st, onHung, healthy, func() { _ = hung.Resume() }
}

func reserveAsync(st *Store, sku, id string, timeout time.Duration) chan error {
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := st.Reserve(ctx, Reservation{Order: inventory.Order{ID: id, SKU: sku, Quantity: 1, UserID: "u", Strategy: "redis-reserve"}})
		res <- err
	}()
	return res
}

// On Redis Cluster, orders for a SKU whose master hangs hold every
// pipeline of that SKU, and an order for a SKU on a healthy master is
// still answered: each SKU has its own pipelines, on its own master. The
// hung SKU's orders come back at their deadline, not at the client's
// socket timeouts and retries.
func TestCoalescerHungMasterHoldsOnlyItsOwnSKUs(t *testing.T) {
	st, onHung, healthy, resume := hungCluster(t, 4)
	c := st.pipelines
	const deadline = 3 * time.Second
	began := time.Now()
	var hungOrders []chan error
	for i := range c.max + 2 {
		hungOrders = append(hungOrders, reserveAsync(st, onHung, fmt.Sprint("p", i), deadline))
	}
	// Every pipeline of the hung master's SKU is out (the orders' deadline
	// is far enough for a slow machine to get there first).
	waitFor(t, c, func() bool { ln := c.lines[onHung]; return ln != nil && ln.leaders == c.max })
	if time.Since(began) < deadline {
		if err := <-reserveAsync(st, healthy, "h", 5*time.Second); err != nil {
			t.Fatalf("an order for a SKU on a healthy master, beside a hung master's: %v", err)
		}
	} else {
		t.Errorf("the hung SKU's pipelines were all out only after %v, past the orders' deadline", time.Since(began).Round(time.Millisecond))
	}
	for i, res := range hungOrders {
		err := <-res
		if !errors.Is(err, inventory.ErrOutcomeUnknown) && !errors.Is(err, inventory.ErrUnavailable) {
			t.Errorf("order %d on the hung master: %v, want unknown or unavailable", i, err)
		}
	}
	// The client's own timeouts and retries would take 20 s and more; the
	// orders' deadline is 3 s (the bound leaves room for a slow machine).
	if waited := time.Since(began); waited > deadline+5*time.Second {
		t.Errorf("the hung master's orders came back after %v; their deadline was %v", waited.Round(time.Millisecond), deadline)
	}
	resume()
	idle(t, c)
}
