package sales_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// handClock is a clock the test moves by hand, for the sold-out mark.
type handClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *handClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *handClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// markStrategies are the strategies the sold-out mark is run on: one of
// each way a strategy takes an order (a transaction the service runs, a
// batch the strategy runs, a lock around the transaction, Redis first).
var markStrategies = []string{strategies.NameConditional, strategies.NameBatched, strategies.NameRedisLock, strategies.NameRedisReserve, strategies.NameRedisWatch}

// forEachMarkStrategy runs test on both engines for markStrategies, each
// with two instances (services) over one database and one strategy's
// servers: a, whose clock the test moves, and b; both with opts.
func forEachMarkStrategy(t *testing.T, test func(t *testing.T, a, b *sales.Service, clock *handClock), opts ...sales.ServiceOption) {
	for _, engine := range store.Engines {
		for _, name := range markStrategies {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 8)
				strategy := builders()[name](t, engine, db)
				clock := &handClock{t: time.Unix(1_000_000, 0)}
				a := sales.NewService(db, strategy, append([]sales.ServiceOption{sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second)}, opts...)...)
				b := sales.NewService(db, strategy, opts...)
				test(t, a, b, clock)
			})
		}
	}
}

func order(t *testing.T, svc *sales.Service, sku, user, key string) (inventory.Order, error) {
	t.Helper()
	return svc.PlaceOrder(context.Background(), inventory.Request{SKU: sku, Quantity: 1, UserID: user, IdempotencyKey: key})
}

// TestSoldOutMarkAnswersWithoutAskingUntilItsBound: once an instance was
// told sold out, it refuses the SKU's orders without asking the store, so
// a unit restocked through another instance is refused to it, for the
// bound and no longer; an instance's own restock lifts its mark at once.
// Nothing is ever let through that the stock does not cover.
func TestSoldOutMarkAnswersWithoutAskingUntilItsBound(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, b *sales.Service, clock *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		// A refusal sent at the very reading of the clock at which the
		// sale started may have read the old sale: it marks nothing.
		clock.step(time.Millisecond)
		if _, err := order(t, a, "s", "u1", ""); err != nil {
			t.Fatalf("the only unit: %v", err)
		}
		if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("an order past the stock: %v, want sold out", err)
		}
		if _, err := b.Restock(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		// In the mark's first half no order asks (in its second half one
		// at a time would, to renew it: TestSoldOutMarkIsRenewedBeforeItEnds).
		clock.step(499 * time.Millisecond)
		if _, err := order(t, a, "s", "u3", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("within the bound of a refusal, a marked instance asked the store (it answered %v)", err)
		}
		// b never saw the sale sold out: it asks, and the unit is there.
		if _, err := order(t, b, "s", "u4", ""); err != nil {
			t.Fatalf("an instance without a mark: %v", err)
		}
		if _, err := order(t, b, "s", "u5", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("b, past the stock: %v", err)
		}
		// b's restock comes back to a once its bound has passed.
		if _, err := b.Restock(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(501 * time.Millisecond)
		if _, err := order(t, a, "s", "u6", ""); err != nil {
			t.Fatalf("past the bound, the restocked unit was refused: %v", err)
		}
		// a's own restock lifts its mark at once.
		if _, err := order(t, a, "s", "u7", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v", err)
		}
		if _, err := a.Restock(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, a, "s", "u8", ""); err != nil {
			t.Fatalf("after the instance's own restock: %v", err)
		}
		// And a new sale through it.
		if _, err := order(t, a, "s", "u9", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v", err)
		}
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, a, "s", "u10", ""); err != nil {
			t.Fatalf("after the instance's own new sale: %v", err)
		}
		audit := quietAudit(t, a, "s")
		if !audit.Consistent() || audit.Available != 0 || audit.Orders != 1 {
			t.Fatalf("audit of the new sale: %+v", audit)
		}
	})
}

// TestSoldOutMarkIsRenewedBeforeItEnds: in the second half of a mark's
// time one order goes to the store, and its refusal renews the mark, so
// the orders after the first mark's end are still refused without asking
// (a unit restocked through another instance meanwhile stays there for
// the renewed mark's time, and no longer).
func TestSoldOutMarkIsRenewedBeforeItEnds(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, b *sales.Service, clock *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(time.Millisecond)
		if _, err := order(t, a, "s", "u1", ""); err != nil {
			t.Fatalf("the only unit: %v", err)
		}
		if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v", err) // the mark: +1 ms to +1001 ms
		}
		clock.step(600 * time.Millisecond)
		if _, err := order(t, a, "s", "probe", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("the probe, past the stock: %v", err) // renewed: to +1601 ms
		}
		if _, err := b.Restock(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		clock.step(400 * time.Millisecond) // +1001 ms: the first mark's end, the renewed one's first half
		if _, err := order(t, a, "s", "u3", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the first mark's end, the renewed mark asked the store (it answered %v)", err)
		}
		if level, err := a.Level(ctx, "s"); err != nil || level.Available != 1 {
			t.Fatalf("the unit b restocked: %+v, %v; want it still there", level, err)
		}
		clock.step(600 * time.Millisecond) // +1601 ms: the renewed mark's end
		if _, err := order(t, a, "s", "u4", ""); err != nil {
			t.Fatalf("past the renewed mark, the restocked unit was refused: %v", err)
		}
	})
}

// TestSoldOutMarkStillReplaysAKeyThatWasTaken: a retry of an order that was
// taken gets its order back from a marked instance, not "sold out".
func TestSoldOutMarkStillReplaysAKeyThatWasTaken(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, _ *sales.Service, _ *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 1); err != nil {
			t.Fatal(err)
		}
		first, err := order(t, a, "s", "u1", "key-1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("past the stock: %v", err)
		}
		again, err := order(t, a, "s", "u1", "key-1")
		if err != nil || again.ID != first.ID {
			t.Fatalf("the retry of a taken order from a marked instance: %+v, %v; want order %s", again, err, first.ID)
		}
	})
}

// TestSoldOutMarkRefusesOnlyOrdersTheRefusalCovers: a refusal of more units
// than are left does not refuse a smaller order the stock covers.
func TestSoldOutMarkRefusesOnlyOrdersTheRefusalCovers(t *testing.T) {
	forEachMarkStrategy(t, func(t *testing.T, a, _ *sales.Service, _ *handClock) {
		ctx := context.Background()
		if err := a.StartSale(ctx, "s", 3); err != nil {
			t.Fatal(err)
		}
		if _, err := a.PlaceOrder(ctx, inventory.Request{SKU: "s", Quantity: 4, UserID: "u1"}); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("4 of 3 units: %v", err)
		}
		for i := range 3 {
			if _, err := a.PlaceOrder(ctx, inventory.Request{SKU: "s", Quantity: 1, UserID: "u2"}); err != nil {
				t.Fatalf("unit %d of 3, after a refusal of 4: %v", i+1, err)
			}
		}
	})
}

// turnstile stands for what an order waits on before its transaction (the
// row's gate, a lock, a retry's pause): its first order waits at the
// turnstile until the test lets it go; the others pass.
type turnstile struct {
	inventory.Strategic
	first   atomic.Bool   // (not a sync.Once: its Do would hold the others too)
	waiting chan struct{} // closed once the first order waits
	pass    chan struct{} // closed by the test to let it go
}

func (w *turnstile) Strategy() inventory.Strategy {
	st := w.Strategic.Strategy()
	inner := st.Deduct
	st.Deduct = func(ctx context.Context, sku string, quantity int64, inTx inventory.TxRunner) error {
		if w.first.CompareAndSwap(false, true) {
			close(w.waiting)
			<-w.pass
		}
		return inner(ctx, sku, quantity, inTx)
	}
	return st
}

// TestSoldOutMarkRefusesAnOrderThatWaitedItsTurn: an order that was waiting
// for its turn when another order of its instance was refused sold out is
// refused by the mark at its turn, without a round trip (the unit restocked
// meanwhile through another instance is still there afterwards), within the
// mark's bound and no longer.
func TestSoldOutMarkRefusesAnOrderThatWaitedItsTurn(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range []string{strategies.NameConditional, strategies.NameVersionCAS, strategies.NameRedisLock} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testdb.New(t, engine, 8)
				gate := &turnstile{Strategic: builders()[name](t, engine, db), waiting: make(chan struct{}), pass: make(chan struct{})}
				clock := &handClock{t: time.Unix(1_000_000, 0)}
				a := sales.NewService(db, gate, sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
				b := sales.NewService(db, gate)
				if err := a.StartSale(ctx, "s", 1); err != nil {
					t.Fatal(err)
				}
				clock.step(time.Millisecond)
				waited := make(chan error, 1)
				go func() {
					_, err := order(t, a, "s", "waits", "")
					waited <- err
				}()
				<-gate.waiting
				if _, err := order(t, a, "s", "u1", ""); err != nil {
					t.Fatalf("the only unit: %v", err)
				}
				clock.step(time.Millisecond)
				if _, err := order(t, a, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("past the stock: %v, want sold out", err)
				}
				if _, err := b.Restock(ctx, "s", 1); err != nil {
					t.Fatal(err)
				}
				close(gate.pass)
				if err := <-waited; !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("the order that waited its turn, within the mark's bound: %v, want sold out by the mark", err)
				}
				if level, err := a.Level(ctx, "s"); err != nil || level.Available != 1 {
					t.Fatalf("the restocked unit after the marked refusal: %+v, %v; want 1 available (no round trip took it)", level, err)
				}
				// Past the bound of the store's refusal (sent at +2 ms),
				// the unit sells.
				clock.step(time.Second)
				if _, err := order(t, a, "s", "u3", ""); err != nil {
					t.Fatalf("past the mark's bound, the restocked unit was refused: %v", err)
				}
				audit := quietAudit(t, a, "s")
				if !audit.Consistent() || audit.Available != 0 || audit.Orders != 2 {
					t.Fatalf("audit: %+v", audit)
				}
			})
		}
	}
}
