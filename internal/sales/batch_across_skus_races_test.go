package sales_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// Batches across SKUs (lanes) in the races an adversarial reading found:
// one SKU's trouble must stay that SKU's.

// hookedBatchStore counts batched's transactions and can pause one after
// it read and locked a stock row (afterLevel): the time a statement, a
// GC pause or the network can take between two statements.
type hookedBatchStore struct {
	store.Store
	txs   atomic.Int64
	began chan struct{} // hears each transaction begin, when not nil
	// gate, when set, holds the next transaction before it begins, until
	// it is closed.
	gate atomic.Pointer[chan struct{}]
	// afterLevel hears each row read and locked, by LockLevel or by
	// DeductEach, once the statement is done.
	afterLevel func(sku string)
	// lockLevels counts the rows read again by LockLevel.
	lockLevels atomic.Int64
}

func (s *hookedBatchStore) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	s.txs.Add(1)
	if s.began != nil {
		select {
		case s.began <- struct{}{}:
		default:
		}
	}
	if gate := s.gate.Swap(nil); gate != nil {
		<-*gate
	}
	return s.Store.InBatchTx(ctx, func(ctx context.Context, tx batched.Tx) error {
		return fn(ctx, laneHookedTx{Tx: tx, s: s})
	})
}

type laneHookedTx struct {
	batched.Tx
	s *hookedBatchStore
}

func (t laneHookedTx) LockLevel(ctx context.Context, sku string) (inventory.Level, error) {
	t.s.lockLevels.Add(1)
	l, err := t.Tx.LockLevel(ctx, sku)
	if err == nil && t.s.afterLevel != nil {
		t.s.afterLevel(sku)
	}
	return l, err
}

func (t laneHookedTx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.afterLevels(skus)(t.Tx.DeductEach(ctx, skus, totals))
}

func (t laneHookedTx) DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]batched.Deduction, error) {
	return t.afterLevels(skus)(t.Tx.DeductEachSkippingHeld(ctx, skus, totals))
}

// afterLevels calls afterLevel for each row a DeductEach statement read
// and locked.
func (t laneHookedTx) afterLevels(skus []string) func([]batched.Deduction, error) ([]batched.Deduction, error) {
	return func(done []batched.Deduction, err error) ([]batched.Deduction, error) {
		if err == nil && t.s.afterLevel != nil {
			for i, d := range done {
				if d.Exists && !d.Held {
					t.s.afterLevel(skus[i])
				}
			}
		}
		return done, err
	}
}

// queueSignal hears each order that waits in its lane's queue.
type queueSignal chan struct{}

func (q queueSignal) Joining(context.Context) {}
func (q queueSignal) Waiting(context.Context) {
	select {
	case q <- struct{}{}:
	default:
	}
}
func (q queueSignal) Woken(context.Context) {}

type answer struct {
	order inventory.Order
	err   error
}

// inOneBatch places reqs through svc so that they form one batch of its
// lane, in the order given: a gate order's batch is held before its
// transaction begins while they queue one after the other; then it goes
// on. (A held row would not do: the lane skips it.) It returns how many
// transactions the batch took, and their answers.
func inOneBatch(t *testing.T, hooked *hookedBatchStore, queued queueSignal, svc *sales.Service, reqs []inventory.Request, beforeRelease ...func()) (int64, []answer) {
	t.Helper()
	ctx := context.Background()
	if err := svc.StartSale(ctx, "gate", 100); err != nil {
		t.Fatal(err)
	}
	for len(queued) > 0 {
		<-queued // an earlier order's: each waits for its answer too
	}
	hold := make(chan struct{})
	hooked.gate.Store(&hold)
	gate := make(chan answer, 1)
	hooked.began = make(chan struct{}, 1)
	go func() {
		o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "gate", Quantity: 1, UserID: "gatekeeper"})
		gate <- answer{o, err}
	}()
	select {
	case <-hooked.began: // the gate's batch is in flight, held
	case <-time.After(10 * time.Second):
		t.Fatal("the gate order's batch never began")
	}
	answers := make([]chan answer, len(reqs))
	for i, req := range reqs {
		answers[i] = make(chan answer, 1)
		go func() {
			o, err := svc.PlaceOrder(ctx, req)
			answers[i] <- answer{o, err}
		}()
		select {
		case <-queued:
		case <-time.After(10 * time.Second):
			t.Fatalf("order %d never queued", i)
		}
	}
	for _, f := range beforeRelease {
		f()
	}
	before := hooked.txs.Load()
	close(hold)
	if g := <-gate; g.err != nil {
		t.Fatalf("gate order: %v", g.err)
	}
	out := make([]answer, len(reqs))
	for i := range reqs {
		out[i] = <-answers[i]
	}
	return hooked.txs.Load() - before, out
}

func newHookedService(t *testing.T, engine string, opts ...batched.Option) (store.Store, *hookedBatchStore, queueSignal, *sales.Service) {
	db := testdb.New(t, engine, 8)
	hooked := &hookedBatchStore{Store: db}
	queued := make(queueSignal, 64)
	b := batched.New(hooked, append([]batched.Option{batched.WithLanes(1), batched.WithQueueObserver(queued)}, opts...)...)
	return db, hooked, queued, sales.NewService(db, b, sales.WithOrderTimeout(30*time.Second))
}

// TestOrdersOfASKUAreDecidedInArrivalOrderWhenAnotherSKUSharesTheirKey:
// in one lane's batch: 1 = 2 units of A (1 left) with key k, 2 =
// one unit of B (1 left) with key k, 3 = one unit of B, no key. Served in
// arrival order, 1 is sold out (its key records nothing), 2 takes B's unit
// and 3 is sold out. sharedKeyLater moves 2 to a later transaction but
// leaves 3 in the first: 3 takes the unit that 2, before it in B's queue,
// was owed, and 2 is sold out.
func TestOrdersOfASKUAreDecidedInArrivalOrderWhenAnotherSKUSharesTheirKey(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			_, hooked, queued, svc := newHookedService(t, engine)
			ctx := context.Background()
			for _, sku := range []string{"key-a", "key-b"} {
				if err := svc.StartSale(ctx, sku, 1); err != nil {
					t.Fatal(err)
				}
			}
			_, got := inOneBatch(t, hooked, queued, svc, []inventory.Request{
				{SKU: "key-a", Quantity: 2, UserID: "u1", IdempotencyKey: "k"},
				{SKU: "key-b", Quantity: 1, UserID: "u2", IdempotencyKey: "k"},
				{SKU: "key-b", Quantity: 1, UserID: "u3"},
			})
			want := []string{"sold_out", "created", "sold_out"}
			for i, a := range got {
				if inventory.Outcome(a.err) != want[i] {
					t.Errorf("order %d: %s (%v), want %s (B's orders in arrival order)", i+1, inventory.Outcome(a.err), a.err, want[i])
				}
			}
		})
	}
}

// TestASaleWindowEndingWhileABatchReplansRefusesOnlyThatSKU: one batch of
// two units of "win" (1 left, its window ends in 3 s) and one of "other".
// The batch deducts other and not win (2 > 1), so win is planned again:
// its row read under the lock shows 1 unit and the window open, then the
// window ends before the next statement, whose deduction refuses. That
// must be win's refusal only (ended), found by the batch running again,
// not an error that fails other's order with it.
func TestASaleWindowEndingWhileABatchReplansRefusesOnlyThatSKU(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			_, hooked, queued, svc := newHookedService(t, engine)
			ctx := context.Background()
			ends := time.Now().Add(3 * time.Second).Truncate(time.Millisecond)
			if err := svc.StartSaleWindow(ctx, "win", 1, inventory.SaleWindow{EndsAt: ends}); err != nil {
				t.Fatal(err)
			}
			if err := svc.StartSale(ctx, "other", 5); err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			hooked.afterLevel = func(sku string) {
				if sku == "win" {
					once.Do(func() { time.Sleep(time.Until(ends) + 300*time.Millisecond) })
				}
			}
			_, got := inOneBatch(t, hooked, queued, svc, []inventory.Request{
				{SKU: "win", Quantity: 1, UserID: "u1"},
				{SKU: "win", Quantity: 1, UserID: "u2"},
				{SKU: "other", Quantity: 1, UserID: "u3"},
			})
			if time.Now().Before(ends) {
				t.Fatal("the batch ran after the window's end: no replan under it")
			}
			if got[2].err != nil {
				t.Errorf("other's order: %v; win's window has nothing to do with it", got[2].err)
			}
			for i, a := range got[:2] {
				if o := inventory.Outcome(a.err); o != "created" && o != "ended" && o != "sold_out" {
					t.Errorf("win's order %d: %s (%v), want created, ended or sold out", i+1, o, a.err)
				}
			}
		})
	}
}

// TestSoldOutSKUsOfABatchAreNotReadAgain: one batch of ten orders, each
// for a sold-out SKU, two for a SKU with one unit left and one for a SKU
// with plenty. The first statement locks and reads every row, so the SKUs
// it could not deduct are planned again from what it read: no row is read
// a second time (a catalog's batch is mostly sold-out SKUs, and each
// such read was a round trip under the batch's locks), and the answers
// are those of the orders served one at a time, in one transaction.
func TestSoldOutSKUsOfABatchAreNotReadAgain(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, hooked, queued, svc := newHookedService(t, engine)
			ctx := context.Background()
			var reqs []inventory.Request
			for i := range 10 {
				sku := fmt.Sprintf("gone-%02d", i)
				if err := svc.StartSale(ctx, sku, 1); err != nil {
					t.Fatal(err)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "early"}); err != nil {
					t.Fatal(err)
				}
				reqs = append(reqs, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("u%d", i)})
			}
			for sku, n := range map[string]int64{"last-one": 1, "plenty": 50} {
				if err := svc.StartSale(ctx, sku, n); err != nil {
					t.Fatal(err)
				}
			}
			reqs = append(reqs,
				inventory.Request{SKU: "last-one", Quantity: 1, UserID: "first"},
				inventory.Request{SKU: "last-one", Quantity: 1, UserID: "second"},
				inventory.Request{SKU: "plenty", Quantity: 2, UserID: "third"})
			reads := hooked.lockLevels.Load()
			txs, got := inOneBatch(t, hooked, queued, svc, reqs)
			want := append(slices.Repeat([]string{"sold_out"}, 10), "created", "sold_out", "created")
			for i, a := range got {
				if o := inventory.Outcome(a.err); o != want[i] {
					t.Errorf("order %d (%s): %s (%v), want %s", i, reqs[i].SKU, o, a.err, want[i])
				}
			}
			// The gate's batch is one SKU's (its conditional UPDATE
			// fits): it reads nothing again either.
			if n := hooked.lockLevels.Load() - reads; n != 0 {
				t.Errorf("%d rows read again after the batch's statement locked and read them all", n)
			}
			if txs != 1 {
				t.Errorf("the batch took %d transactions, want 1", txs)
			}
			for sku, want := range map[string]int64{"gone-00": 1, "last-one": 1, "plenty": 2} {
				if a, err := db.Audit(ctx, sku); err != nil || !a.Consistent() || a.Ordered != want {
					t.Errorf("%s: audit %+v (%v), want %d ordered", sku, a, err, want)
				}
			}
		})
	}
}

// TestUnknownSKUsOfABatchAreLeftOutInOneRetry: one batch of ten orders,
// each for a SKU that has no sale, and one for a SKU on sale: the batch
// runs again once, without all ten, and the good order is taken. Found one
// at a time, they took eleven transactions, each locking the good SKU's
// row (with 255 of them, 256: the lane's good orders waited them out, or
// were busy).
func TestUnknownSKUsOfABatchAreLeftOutInOneRetry(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			_, hooked, queued, svc := newHookedService(t, engine)
			if err := svc.StartSale(context.Background(), "real", 5); err != nil {
				t.Fatal(err)
			}
			var reqs []inventory.Request
			for i := range 10 {
				reqs = append(reqs, inventory.Request{SKU: fmt.Sprintf("nosuch-%02d", i), Quantity: 1, UserID: fmt.Sprintf("u%d", i)})
			}
			reqs = append(reqs, inventory.Request{SKU: "real", Quantity: 1, UserID: "good"})
			txs, got := inOneBatch(t, hooked, queued, svc, reqs)
			for i, a := range got[:10] {
				if inventory.Outcome(a.err) != "unknown_sku" {
					t.Errorf("order %d: %v, want unknown SKU", i, a.err)
				}
			}
			if got[10].err != nil {
				t.Errorf("the good order: %v", got[10].err)
			}
			if txs > 2 {
				t.Errorf("the batch took %d transactions: one a unknown SKU, each locking the good SKU's row again", txs)
			}
		})
	}
}

// TestBatchWhoseCommitAnswerIsLostIsResolvedForEverySKU: one
// batch of two SKUs whose COMMIT lands after its answer was lost: the
// lookup of its first created order (SKU A) waits on A's row, which the
// batch holds until its commit, and then finds it; both SKUs' buyers get
// their 201s and both orders exist.
func TestBatchWhoseCommitAnswerIsLostIsResolvedForEverySKU(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 8)
			late := &lateBatchCommit{Store: db, held: make(chan int64, 1), release: make(chan struct{}), done: make(chan error, 1)}
			hooked := &hookedBatchStore{Store: late}
			queued := make(queueSignal, 64)
			svc := sales.NewService(db, batched.New(hooked, batched.WithLanes(1), batched.WithQueueObserver(queued)), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			for _, sku := range []string{"lost-a", "lost-b"} {
				if err := svc.StartSale(ctx, sku, 3); err != nil {
					t.Fatal(err)
				}
			}
			var releaseOnce sync.Once
			t.Cleanup(func() { releaseOnce.Do(func() { close(late.release) }) })
			done := make(chan []answer, 1)
			go func() {
				// Armed while the gate's batch waits: the next batch, of
				// both SKUs, is the late one.
				_, got := inOneBatch(t, hooked, queued, svc, []inventory.Request{
					{SKU: "lost-b", Quantity: 1, UserID: "u-b"},
					{SKU: "lost-a", Quantity: 1, UserID: "u-a"},
				}, func() { late.armed.Store(true) })
				done <- got
			}()
			holder := <-late.held
			raw.waitBlockedByOr(t, holder, 1, nil)
			releaseOnce.Do(func() { close(late.release) })
			if err := <-late.done; err != nil {
				t.Fatalf("the late commit: %v", err)
			}
			got := <-done
			for i, a := range got {
				if a.err != nil {
					t.Errorf("order %d: %v, though its batch committed", i, a.err)
				}
			}
			for _, sku := range []string{"lost-a", "lost-b"} {
				if a := checkAudit(t, svc, sku, 3); a.Orders != 1 {
					t.Errorf("%s: %d orders", sku, a.Orders)
				}
			}
		})
	}
}
