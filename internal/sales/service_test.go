package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/locked"
	"github.com/flashsale/stock/internal/locking/inventorylock"
	"github.com/flashsale/stock/internal/locking/redislock"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// scriptedStore is a small fake of the transaction boundary: each InTx call
// returns the next scripted error (after running fn, so the strategy's
// statements run against the embedded real store's transaction).
type scriptedStore struct {
	inventory.Store
	mu      sync.Mutex
	script  []error
	calls   int
	lookups int
}

func (s *scriptedStore) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	s.mu.Lock()
	s.calls++
	var next error
	if len(s.script) > 0 {
		next, s.script = s.script[0], s.script[1:]
	}
	s.mu.Unlock()
	if next != nil {
		return next
	}
	return s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, countedLookups{Tx: tx, s: s})
	})
}

// countedLookups counts its transaction's ResolveOrder calls on s.
type countedLookups struct {
	inventory.Tx
	s *scriptedStore
}

func (t countedLookups) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	t.s.mu.Lock()
	t.s.lookups++
	t.s.mu.Unlock()
	return t.Tx.ResolveOrder(ctx, sku, id)
}

func TestConflictsAreRetriedThenBusy(t *testing.T) {
	db := testdb.New(t, "postgres", 4)
	ctx := context.Background()
	conflict := fmt.Errorf("%w: deadlock detected (SQLSTATE 40P01)", inventory.ErrConflict)

	fake := &scriptedStore{Store: db, script: []error{conflict, conflict}}
	svc := sales.NewService(fake, sqlrow.NewConditional(), sales.WithTxAttempts(3))
	if err := svc.StartSale(ctx, "s-1", 5); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"}); err != nil {
		t.Fatalf("two conflicts then success: %v", err)
	}
	if fake.calls != 3 {
		t.Errorf("%d transactions, want 3", fake.calls)
	}

	fake.script = []error{conflict, conflict, conflict}
	fake.calls = 0
	_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"})
	if !errors.Is(err, inventory.ErrBusy) || !errors.Is(err, inventory.ErrConflict) {
		t.Errorf("conflicts past the bound: %v, want busy wrapping the conflict", err)
	}
	if fake.calls != 3 {
		t.Errorf("%d transactions, want exactly the bound of 3", fake.calls)
	}
	a, err := svc.Audit(ctx, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if a.Available != 4 || a.Orders != 1 {
		t.Errorf("audit %+v: want one order", a)
	}
}

// TestUnknownCommitIsNeverRetried: when a commit's answer is lost, the service
// does not run the transaction again; it looks the order up.
func TestUnknownCommitIsNeverRetried(t *testing.T) {
	db := testdb.New(t, "postgres", 4)
	ctx := context.Background()
	lost := fmt.Errorf("%w: connection reset during COMMIT", inventory.ErrOutcomeUnknown)
	fake := &scriptedStore{Store: db, script: []error{lost}}
	svc := sales.NewService(fake, sqlrow.NewConditional(), sales.WithTxAttempts(5))
	if err := svc.StartSale(ctx, "s-1", 5); err != nil {
		t.Fatal(err)
	}
	_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"})
	// The lookup waits for the SKU's row, so its "no order" is final: the
	// order was not taken (unavailable), and the answer says nothing was
	// deducted rather than that it may have been.
	if !errors.Is(err, inventory.ErrUnavailable) || errors.Is(err, inventory.ErrOutcomeUnknown) {
		t.Errorf("lost commit with no order row: %v, want unavailable, known not taken", err)
	}
	// The order's transaction once (never run again), and the lookup's.
	if fake.calls != 2 || fake.lookups != 1 {
		t.Errorf("%d transactions and %d lookups, want 2 (the order, the lookup) and 1", fake.calls, fake.lookups)
	}
}

// commitThenLose commits its first transaction for real, then reports the
// answer as lost, as a connection that drops right after COMMIT reaches
// the server would.
type commitThenLose struct {
	inventory.Store
	lost *atomic.Bool
}

func (s commitThenLose) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	if err := s.Store.InTx(ctx, fn); err != nil || s.lost.Swap(true) {
		return err
	}
	return fmt.Errorf("%w: connection reset after COMMIT", inventory.ErrOutcomeUnknown)
}

func TestUnknownCommitThatHappenedIsAnOrder(t *testing.T) {
	db := testdb.New(t, "mysql", 4)
	ctx := context.Background()
	svc := sales.NewService(commitThenLose{Store: db, lost: new(atomic.Bool)}, sqlrow.NewForUpdate())
	if err := svc.StartSale(ctx, "s-1", 5); err != nil {
		t.Fatal(err)
	}
	o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 2, UserID: "u"})
	if err != nil {
		t.Fatalf("the order was committed, yet: %v", err)
	}
	if _, found, err := db.FindOrder(ctx, o.ID); err != nil || !found {
		t.Errorf("order %s: found %v, err %v", o.ID, found, err)
	}
}

// TestClientHangUpLeavesWholeOrder: cancelling the caller's context in the
// middle of an order neither cuts it in half nor loses its answer.
func TestClientHangUpLeavesWholeOrder(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			entered, hungUp := make(chan struct{}), make(chan struct{})
			svc := sales.NewService(db, hookAfterRead{sqlrow.NewForUpdate(), entered, hungUp})
			if err := svc.StartSale(context.Background(), "s-1", 5); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				<-entered
				cancel() // the client hangs up while the row is locked
				close(hungUp)
			}()
			o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 2, UserID: "u"})
			if err != nil {
				t.Fatalf("order after hang-up: %v", err)
			}
			a, err := svc.Audit(context.Background(), "s-1")
			if err != nil {
				t.Fatal(err)
			}
			if a.Orders != 1 || a.Available != 3 || !a.Consistent() {
				t.Errorf("order %s, audit %+v: want one whole order", o.ID, a)
			}
		})
	}
}

// hookAfterRead wraps a strategy so that the test learns when its first
// statement ran, and holds the transaction open until the caller has hung up.
type hookAfterRead struct {
	inventory.Strategic
	entered, hungUp chan struct{}
}

func (h hookAfterRead) Strategy() inventory.Strategy {
	st := h.Strategic.Strategy()
	inner := st.Deduct
	st.Deduct = func(ctx context.Context, sku string, q int64, inTx inventory.TxRunner) error {
		return h.deduct(ctx, sku, q, inTx, inner)
	}
	return st
}

func (h hookAfterRead) deduct(ctx context.Context, sku string, q int64, inTx inventory.TxRunner, inner func(context.Context, string, int64, inventory.TxRunner) error) error {
	return inner(ctx, sku, q, func(ctx context.Context, deduct func(context.Context, inventory.StockTx) error) error {
		return inTx(ctx, func(ctx context.Context, tx inventory.StockTx) error {
			if _, err := tx.LockLevel(ctx, sku); err != nil {
				return err
			}
			close(h.entered)
			<-h.hungUp
			// The service detached the order from the caller: this context
			// must outlive the caller's cancel, or the order would be cut.
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("order context ended with the caller: %w", err)
			}
			return deduct(ctx, tx)
		})
	})
}

// TestCASExhaustionIsBusy: with one attempt, lost races answer ErrBusy and
// deduct nothing, and the books still balance.
func TestCASExhaustionIsBusy(t *testing.T) {
	db := testdb.New(t, "postgres", 16)
	svc := sales.NewService(db, sqlrow.NewVersionCAS(sqlrow.WithMaxAttempts(1)))
	if err := svc.StartSale(context.Background(), "cas", 1000); err != nil {
		t.Fatal(err)
	}
	results := race(t, svc, "cas", 100)
	var busy, ok int64
	var sold int64
	for _, r := range results {
		switch {
		case r.err == nil:
			ok++
			sold += r.quantity
		case errors.Is(r.err, inventory.ErrBusy):
			busy++
		default:
			t.Errorf("unexpected: %v", r.err)
		}
	}
	a, err := svc.Audit(context.Background(), "cas")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ok, %d busy, audit %+v", ok, busy, a)
	if a.Orders != ok || a.Ordered != sold || !a.Consistent() {
		t.Errorf("audit %+v does not match %d successes of %d units", a, ok, sold)
	}
	if busy == 0 {
		t.Errorf("100 racing buyers with one CAS attempt each: expected some to lose")
	}
}

// TestLockedUnknownSKULeavesNoKeys: requests for SKUs that do not exist are
// answered without taking a lock, so a flood of them leaves nothing in Redis.
func TestLockedUnknownSKULeavesNoKeys(t *testing.T) {
	db := testdb.New(t, "postgres", 4)
	rdb := testredis.Start(t).Client(t)
	locker := redislock.New(rdb)
	t.Cleanup(func() { _ = locker.Close() })
	svc := sales.NewService(db, locked.New(strategies.NameRedisLock, inventorylock.Adapt(locker),
		locked.WithSKULookup(func(ctx context.Context, sku string) error {
			_, err := db.Level(ctx, sku)
			return err
		})))
	ctx := context.Background()
	for i := range 200 {
		_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: fmt.Sprintf("ghost-%d", i), Quantity: 1, UserID: "u"})
		if !errors.Is(err, inventory.ErrUnknownSKU) {
			t.Fatalf("unknown SKU: %v", err)
		}
	}
	if n := rdb.DBSize(ctx).Val(); n != 0 {
		t.Errorf("%d keys left in Redis by orders for unknown SKUs", n)
	}
}

// TestFenceRecoversAfterRedisWipe: a Redis restarted without its data starts
// the fencing counter again below the fence the stock row holds. The first
// order is refused (its token is stale as far as the row can tell) and
// pushes the counter past the row's fence, so the next one sells.
func TestFenceRecoversAfterRedisWipe(t *testing.T) {
	db := testdb.New(t, "mysql", 4)
	srv := testredis.Start(t)
	locker := redislock.New(srv.Client(t))
	t.Cleanup(func() { _ = locker.Close() })
	svc := sales.NewService(db, locked.New(strategies.NameRedisLock, inventorylock.Adapt(locker)))
	ctx := context.Background()
	if err := svc.StartSale(ctx, "s-1", 10); err != nil {
		t.Fatal(err)
	}
	buy := func() error {
		_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"})
		return err
	}
	for range 3 {
		if err := buy(); err != nil {
			t.Fatal(err)
		}
	}
	srv.Stop()
	srv.Restart(t)
	if err := buy(); !errors.Is(err, inventory.ErrFencedOff) {
		t.Fatalf("first order after the wipe: %v, want fenced off", err)
	}
	if err := buy(); err != nil {
		t.Fatalf("second order after the wipe: %v, want it sold", err)
	}
	a, err := svc.Audit(ctx, "s-1")
	if err != nil {
		t.Fatal(err)
	}
	if a.Orders != 4 || a.Available != 6 || !a.Consistent() {
		t.Errorf("audit %+v", a)
	}
}
