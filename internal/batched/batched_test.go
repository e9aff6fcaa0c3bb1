package batched_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// TestBatchedIdempotencyAcrossInstances: two instances with the batched
// strategy take retries of the same requests at once, several in one batch
// and several on each instance. Each key makes one order, every answer under
// a key names it, and a key reused for another request is refused.
func TestBatchedIdempotencyAcrossInstances(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 16)
			ctx := context.Background()
			instances := []*sales.Service{
				sales.NewService(db, batched.New(db)),
				sales.NewService(db, batched.New(db)),
			}
			const sku, keys, tries = "idem", 20, 6
			if err := instances[0].StartSale(ctx, sku, 1000); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				key   int
				order inventory.Order
				err   error
			}
			answers := make(chan answer, keys*tries)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for k := range keys {
				for try := range tries {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						req := inventory.Request{SKU: sku, Quantity: int64(k%3 + 1), UserID: fmt.Sprintf("u-%d", k), IdempotencyKey: fmt.Sprintf("key-%d", k)}
						o, err := instances[try%2].PlaceOrder(ctx, req)
						answers <- answer{key: k, order: o, err: err}
					}()
				}
			}
			close(start)
			wg.Wait()
			close(answers)
			orderOf := map[int]string{}
			var units int64
			for a := range answers {
				if a.err != nil {
					t.Errorf("key %d: %v", a.key, a.err)
					continue
				}
				if prior, ok := orderOf[a.key]; !ok {
					orderOf[a.key] = a.order.ID
					units += a.order.Quantity
				} else if prior != a.order.ID {
					t.Errorf("key %d answered orders %s and %s", a.key, prior, a.order.ID)
				}
			}
			audit, err := instances[0].Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if audit.Orders != keys || audit.Ordered != units || !audit.Consistent() {
				t.Errorf("audit %+v: want %d orders for %d units", audit, keys, units)
			}
			_, err = instances[1].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "someone else", IdempotencyKey: "key-0"})
			if !errors.Is(err, inventory.ErrIdempotencyConflict) {
				t.Errorf("a key reused for another request: %v, want an idempotency conflict", err)
			}
		})
	}
}

// TestBatchedNextToOtherStrategies: batched instances share a SKU with
// conditional and for-update ones; together they sell exactly the stock.
func TestBatchedNextToOtherStrategies(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 16)
			ctx := context.Background()
			instances := []*sales.Service{
				sales.NewService(db, batched.New(db)),
				sales.NewService(db, sqlrow.NewConditional()),
				sales.NewService(db, batched.New(db)),
				sales.NewService(db, sqlrow.NewForUpdate()),
			}
			const sku, initial, buyers = "mixed", 50, 200
			if err := instances[0].StartSale(ctx, sku, initial); err != nil {
				t.Fatal(err)
			}
			var sold, minRefused int64 = 0, 1 << 62
			var mu sync.Mutex
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range buyers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					q := int64(i%3 + 1)
					_, err := instances[i%len(instances)].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: q, UserID: "u"})
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						sold += q
					case errors.Is(err, inventory.ErrSoldOut):
						minRefused = min(minRefused, q)
					default:
						t.Errorf("buyer %d: %v", i, err)
					}
				}()
			}
			close(start)
			wg.Wait()
			audit, err := instances[0].Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if !audit.Consistent() || audit.Ordered != sold || audit.Available >= minRefused {
				t.Errorf("audit %+v, answers sold %d, smallest refusal %d", audit, sold, minRefused)
			}
		})
	}
}

// scriptedBatchStore returns the next scripted error instead of a batch's
// transaction, or, for errLostAfterCommit, commits it for real and then
// reports its answer lost.
type scriptedBatchStore struct {
	store.Store
	mu     sync.Mutex
	script []error
	calls  int
}

var errLostAfterCommit = errors.New("commit for real, then lose the answer")

func (s *scriptedBatchStore) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	s.mu.Lock()
	s.calls++
	var next error
	if len(s.script) > 0 {
		next, s.script = s.script[0], s.script[1:]
	}
	s.mu.Unlock()
	switch {
	case errors.Is(next, errLostAfterCommit):
		if err := s.Store.InBatchTx(ctx, fn); err != nil {
			return err
		}
		return fmt.Errorf("%w: connection reset after COMMIT", inventory.ErrOutcomeUnknown)
	case next != nil:
		return next
	}
	return s.Store.InBatchTx(ctx, fn)
}

// TestBatchedFailures: conflicts are retried a bounded number of times,
// then busy; a lost commit answer is resolved by the order's id, never run
// again; an unknown SKU is answered as such.
func TestBatchedFailures(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 4)
			ctx := context.Background()
			fake := &scriptedBatchStore{Store: db}
			svc := sales.NewService(db, batched.New(fake, batched.WithTxAttempts(3)))
			if err := svc.StartSale(ctx, "s-1", 5); err != nil {
				t.Fatal(err)
			}
			buy := func() (inventory.Order, error) {
				return svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: "u"})
			}
			conflict := fmt.Errorf("%w: deadlock detected", inventory.ErrConflict)
			lost := fmt.Errorf("%w: connection reset during COMMIT", inventory.ErrOutcomeUnknown)

			fake.script, fake.calls = []error{conflict, conflict}, 0
			if _, err := buy(); err != nil || fake.calls != 3 {
				t.Errorf("two conflicts then success: %v after %d transactions", err, fake.calls)
			}
			fake.script, fake.calls = []error{conflict, conflict, conflict}, 0
			if _, err := buy(); !errors.Is(err, inventory.ErrBusy) || !errors.Is(err, inventory.ErrConflict) || fake.calls != 3 {
				t.Errorf("conflicts past the bound: %v after %d transactions, want busy after 3", err, fake.calls)
			}
			fake.script, fake.calls = []error{lost}, 0
			if _, err := buy(); !errors.Is(err, inventory.ErrOutcomeUnknown) || fake.calls != 1 {
				t.Errorf("lost commit, no order: %v after %d transactions, want the unknown outcome after 1", err, fake.calls)
			}
			fake.script, fake.calls = []error{errLostAfterCommit}, 0
			o, err := buy()
			// The batch's transaction once, and the lookup's.
			if err != nil || fake.calls != 2 {
				t.Errorf("lost answer of a commit that landed: %v after %d transactions, want 2 (the batch, the lookup)", err, fake.calls)
			} else if _, found, err := db.FindOrder(ctx, o.ID); !found || err != nil {
				t.Errorf("order %s: found %v, %v", o.ID, found, err)
			}
			if a, err := svc.Audit(ctx, "s-1"); err != nil || a.Orders != 2 || !a.Consistent() {
				t.Errorf("audit %+v, %v: want 2 orders", a, err)
			}
			if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "nope", Quantity: 1, UserID: "u"}); !errors.Is(err, inventory.ErrUnknownSKU) {
				t.Errorf("unknown SKU: %v", err)
			}
		})
	}
}
