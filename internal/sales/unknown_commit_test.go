package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// lateCommit is a store whose armed transaction reports its commit answer
// lost (ErrOutcomeUnknown) while its COMMIT has not landed yet: it holds
// the transaction, row locks and all, until release, and commits then. The
// session holding it is sent on held.
type lateCommit struct {
	store.Store
	armed   atomic.Bool
	held    chan int64
	release chan struct{}
	done    chan error
}

func (s *lateCommit) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.InTx(ctx, fn)
	}
	return holdCommit(ctx, s.Store.InTx, fn, s.held, s.release, s.done)
}

// holdCommit runs fn in a transaction begun by begin on a goroutine of its
// own, and once fn is done reports the commit's answer lost
// (ErrOutcomeUnknown) while the transaction, row locks and all, waits for
// release to commit; its session is sent on held, its end on done.
func holdCommit[T any](ctx context.Context, begin func(context.Context, func(context.Context, T) error) error,
	fn func(context.Context, T) error, held chan<- int64, release <-chan struct{}, done chan<- error) error {
	ready := make(chan error, 1)
	go func() {
		done <- begin(context.WithoutCancel(ctx), func(ctx context.Context, tx T) error {
			err := fn(ctx, tx)
			ready <- err
			if err == nil {
				held <- sessionOfTx(ctx, tx)
				<-release
			}
			return err
		})
	}()
	if err := <-ready; err != nil {
		return err
	}
	return fmt.Errorf("%w: connection reset while COMMIT was on its way (test)", inventory.ErrOutcomeUnknown)
}

// sessionOfTx is the database session of tx (0 when it has none).
func sessionOfTx(ctx context.Context, tx any) int64 {
	s, ok := tx.(interface {
		SessionID(context.Context) (int64, error)
	})
	if !ok {
		return 0
	}
	id, _ := s.SessionID(ctx)
	return id
}

// TestOrderWhoseCommitLandsAfterItsAnswerWasLostIsFound: the commit's
// answer is lost while the COMMIT is still on its way; the lookup that
// resolves it waits for the SKU's row (every transaction that wrote it
// has ended), so it finds the order that lands after the lookup began and
// the buyer gets the 201. Before, a plain read found nothing and the
// buyer was told 503 for an order that existed (found by an overload run:
// two such orders, their buyers unable to learn of them).
func TestOrderWhoseCommitLandsAfterItsAnswerWasLostIsFound(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, raw := dbWithRawAccess(t, engine, 8)
			late := &lateCommit{Store: db, held: make(chan int64, 1), release: make(chan struct{}), done: make(chan error, 1)}
			svc := sales.NewService(late, sqlrow.NewConditional(), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "late", 3); err != nil {
				t.Fatal(err)
			}
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(late.release) }) }
			// Whatever happens, the held transaction ends before the
			// database is closed.
			t.Cleanup(release)
			late.armed.Store(true)
			placed := make(chan result, 1)
			answered := make(chan struct{})
			go func() {
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "late", Quantity: 1, UserID: "u-late"})
				placed <- result{order: o, err: err}
				close(answered)
			}()
			holder := <-late.held
			// The lookup waits behind the transaction that holds the row;
			// an answer before the commit landed is the defect.
			if !raw.waitBlockedByOr(t, holder, 1, answered) {
				r := <-placed
				t.Fatalf("the buyer was answered (%+v, %v) before the commit it asked about landed", r.order, r.err)
			}
			release()
			if err := <-late.done; err != nil {
				t.Fatalf("the late commit: %v", err)
			}
			r := <-placed
			if r.err != nil {
				t.Fatalf("the order whose commit landed after its answer was lost: %v, want it found (201)", r.err)
			}
			if found, err := svc.FindOrder(ctx, r.order.ID, "u-late"); err != nil || found.ID != r.order.ID {
				t.Errorf("the order answered: %v", err)
			}
		})
	}
}

// TestOrderWhoseCommitNeverLandedIsNotTaken: a lost commit answer whose
// transaction rolled back is resolved too: the answer says nothing was
// deducted (unavailable), not that the order may exist.
func TestOrderWhoseCommitNeverLandedIsNotTaken(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, _ := dbWithRawAccess(t, engine, 8)
			lost := &rollbackLosingAnswer{Store: db}
			svc := sales.NewService(lost, sqlrow.NewConditional(), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "gone", 3); err != nil {
				t.Fatal(err)
			}
			lost.armed.Store(true)
			_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "gone", Quantity: 1, UserID: "u"})
			if !errors.Is(err, inventory.ErrUnavailable) || errors.Is(err, inventory.ErrOutcomeUnknown) {
				t.Fatalf("an order whose transaction rolled back behind a lost answer: %v, want unavailable and known not taken", err)
			}
			if a := checkAudit(t, svc, "gone", 3); a.Orders != 0 {
				t.Errorf("%+v: want no order", a)
			}
		})
	}
}

// rollbackLosingAnswer rolls its armed transaction back and reports the
// commit's answer lost.
type rollbackLosingAnswer struct {
	store.Store
	armed atomic.Bool
}

var errRolledBack = errors.New("rolled back by the test")

func (s *rollbackLosingAnswer) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	if !s.armed.CompareAndSwap(true, false) {
		return s.Store.InTx(ctx, fn)
	}
	err := s.Store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return errRolledBack
	})
	if !errors.Is(err, errRolledBack) {
		return err
	}
	return fmt.Errorf("%w: connection reset (test)", inventory.ErrOutcomeUnknown)
}

// slowToAnswer is a store whose lookups of a lost commit fail while the
// database is overloaded (the first fails lookups), then answer.
type slowToAnswer struct {
	loseCommitAnswer
	fails atomic.Int32
}

func (s *slowToAnswer) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	return s.loseCommitAnswer.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		return fn(ctx, failingLookups{Tx: tx, fails: &s.fails})
	})
}

// failingLookups fails ResolveOrder while fails is positive.
type failingLookups struct {
	inventory.Tx
	fails *atomic.Int32
}

func (t failingLookups) ResolveOrder(ctx context.Context, sku, id string) (inventory.Order, bool, error) {
	if t.fails.Add(-1) >= 0 {
		return inventory.Order{}, false, fmt.Errorf("%w: too many connections (test)", inventory.ErrUnavailable)
	}
	return t.Tx.ResolveOrder(ctx, sku, id)
}

// TestLookupOfALostCommitHasABudgetOfItsOwn: the lookup that resolves a
// lost commit answer tries again while the database does not answer it,
// on a budget of its own, not the rest of the order's deadline: the
// buyer gets the 201 of the order that exists (before, one failed lookup
// made it a 503, and without a key the buyer could not learn of it).
func TestLookupOfALostCommitHasABudgetOfItsOwn(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, _ := dbWithRawAccess(t, engine, 8)
			slow := &slowToAnswer{loseCommitAnswer: loseCommitAnswer{Store: db}}
			// The order's own time is short: the lookups outlast it.
			svc := sales.NewService(slow, sqlrow.NewConditional(), sales.WithOrderTimeout(time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "slow", 3); err != nil {
				t.Fatal(err)
			}
			slow.armed.Store(1)
			slow.fails.Store(3)
			o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "slow", Quantity: 1, UserID: "u"})
			if err != nil {
				t.Fatalf("an order whose commit landed, its lookups failing three times: %v, want 201", err)
			}
			if page, err := svc.ListOrders(ctx, "u", "slow", "", 0); err != nil || len(page.Orders) != 1 || page.Orders[0].ID != o.ID {
				t.Errorf("the buyer's orders: %+v %v", page, err)
			}
		})
	}
}
