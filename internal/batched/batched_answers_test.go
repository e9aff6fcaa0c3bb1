package batched_test

// Each order of a batch gets the answer it would get on its own: an
// idempotency key decided against the database's record only, answers
// that stand when a write-free batch's commit answer is lost, a panicking
// batch answered and its SKU freed, a batch wait that leaves the order time
// to run. Each test forms its batches deterministically: the first batch
// transaction of the SKU is held at a gate until the orders of the next
// batch are queued (the queue observer's Waiting says so), then released.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

type orderName struct{}

func named(name string) context.Context {
	return context.WithValue(context.Background(), orderName{}, name)
}

// waitingObserver reports the name of each order that waits in its queue.
type waitingObserver struct{ waiting chan string }

func (waitingObserver) Joining(context.Context) {}
func (r waitingObserver) Waiting(ctx context.Context) {
	if n, ok := ctx.Value(orderName{}).(string); ok {
		select {
		case r.waiting <- n:
		default:
		}
	}
}
func (waitingObserver) Woken(context.Context) {}

// gatedBatchStore holds the first batch transaction at a gate; the batch
// transaction numbered panicAt panics; the one numbered loseAt commits for
// real and then reports its answer lost.
type gatedBatchStore struct {
	store.Store
	mu      sync.Mutex
	calls   int
	gate    bool
	entered chan struct{}
	release chan struct{}
	panicAt int
	loseAt  int
}

func (g *gatedBatchStore) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	g.mu.Lock()
	g.calls++
	n := g.calls
	g.mu.Unlock()
	if n == 1 && g.gate {
		g.entered <- struct{}{}
		<-g.release
	}
	if n == g.panicAt {
		panic("injected: a bug somewhere under the batch's transaction")
	}
	if n == g.loseAt {
		if err := g.Store.InBatchTx(ctx, fn); err != nil {
			return err
		}
		return fmt.Errorf("%w: connection reset after COMMIT", inventory.ErrOutcomeUnknown)
	}
	return g.Store.InBatchTx(ctx, fn)
}

type rigAnswer struct {
	order inventory.Order
	err   error
}

// batchRig is a batched service whose second batch is exactly the orders
// the test queues behind a held first order.
type batchRig struct {
	t     *testing.T
	db    store.Store
	gs    *gatedBatchStore
	obs   waitingObserver
	svc   *sales.Service
	plain *sales.Service
}

func newBatchRig(t *testing.T, engine string, opts ...sales.ServiceOption) *batchRig {
	db := testdb.New(t, engine, 8)
	gs := &gatedBatchStore{Store: db, entered: make(chan struct{}, 1), release: make(chan struct{})}
	obs := waitingObserver{waiting: make(chan string, 100)}
	return &batchRig{
		t: t, db: db, gs: gs, obs: obs,
		svc:   sales.NewService(db, batched.New(gs, batched.WithQueueObserver(obs)), opts...),
		plain: sales.NewService(db, sqlrow.NewConditional()),
	}
}

func (r *batchRig) place(name string, req inventory.Request) chan rigAnswer {
	out := make(chan rigAnswer, 1)
	go func() {
		o, err := r.svc.PlaceOrder(named(name), req)
		out <- rigAnswer{o, err}
	}()
	return out
}

// batch places a holder order (1 unit, no key), holds its transaction, queues
// reqs in order behind it, then lets everything run. It returns the answers
// of reqs.
func (r *batchRig) batch(sku string, reqs ...inventory.Request) (holder chan rigAnswer, answers []chan rigAnswer) {
	r.gs.gate = true
	holder = r.place("holder", inventory.Request{SKU: sku, Quantity: 1, UserID: "holder"})
	<-r.gs.entered
	for i, req := range reqs {
		name := fmt.Sprintf("o%d", i)
		answers = append(answers, r.place(name, req))
		for n := range r.obs.waiting {
			if n == name {
				break
			}
		}
	}
	close(r.gs.release)
	return holder, answers
}

// TestBatchedRetryNextToReusedKeyReplays: key K made an order (2 units).
// A batch holds [B: K with another body, C: K with K's own body, a genuine
// retry]. Each is compared with the database's record of K on its own, as
// in any serial order: B is the conflict (422), C replays K's order, not
// a 422 from deciding keys among the batch's own orders first.
func TestBatchedRetryNextToReusedKeyReplays(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			r := newBatchRig(t, engine)
			ctx := context.Background()
			const sku = "bx-reuse"
			if err := r.svc.StartSale(ctx, sku, 10); err != nil {
				t.Fatal(err)
			}
			first, err := r.plain.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 2, UserID: "u", IdempotencyKey: "K"})
			if err != nil {
				t.Fatal(err)
			}
			holder, ans := r.batch(sku,
				inventory.Request{SKU: sku, Quantity: 1, UserID: "u", IdempotencyKey: "K"}, // another body
				inventory.Request{SKU: sku, Quantity: 2, UserID: "u", IdempotencyKey: "K"}, // the retry
			)
			if a := <-holder; a.err != nil {
				t.Fatalf("holder: %v", a.err)
			}
			b, c := <-ans[0], <-ans[1]
			if !errors.Is(b.err, inventory.ErrIdempotencyConflict) {
				t.Errorf("B (K, another body): %+v, want 422", b)
			}
			if c.err != nil || c.order.ID != first.ID {
				t.Errorf("C (K, the body K was stored with): %v / %s, want a replay of %s", c.err, c.order.ID, first.ID)
			}
		})
	}
}

// TestBatchedRefusedOrderDoesNotClaimKey: one unit is left. A batch holds
// [B: key K, 2 units, C: key K, 1 unit (another body)]. B is sold out, so
// nothing records K; serially C is then a fresh request and gets the unit,
// as every other strategy answers, not 422 for a key that has no record
// (which would leave the unit unsold).
func TestBatchedRefusedOrderDoesNotClaimKey(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			r := newBatchRig(t, engine)
			ctx := context.Background()
			const sku = "bx-refused"
			if err := r.svc.StartSale(ctx, sku, 2); err != nil { // the holder takes 1
				t.Fatal(err)
			}
			holder, ans := r.batch(sku,
				inventory.Request{SKU: sku, Quantity: 2, UserID: "u", IdempotencyKey: "K"},
				inventory.Request{SKU: sku, Quantity: 1, UserID: "u", IdempotencyKey: "K"},
			)
			if a := <-holder; a.err != nil {
				t.Fatalf("holder: %v", a.err)
			}
			b, c := <-ans[0], <-ans[1]
			if !errors.Is(b.err, inventory.ErrSoldOut) {
				t.Errorf("B (2 units, 1 left): %+v, want sold out", b)
			}
			if c.err != nil {
				t.Errorf("C (1 unit, K has no record since B was refused): %v, want 201", c.err)
			}
			if a, err := r.svc.Audit(ctx, sku); err == nil {
				t.Logf("audit %+v", a)
			}
		})
	}
}

// TestBatchedLostCommitOfWriteFreeBatchKeepsAnswers: the commit answer of
// a batch that wrote nothing (it only replayed a key, or only refused sold
// out) is lost. Its answers are known whether the commit landed or not, so
// they stand, not "outcome unknown" (503) for want of a created order to
// look up.
func TestBatchedLostCommitOfWriteFreeBatchKeepsAnswers(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			r := newBatchRig(t, engine)
			ctx := context.Background()
			const sku = "bx-lost"
			if err := r.svc.StartSale(ctx, sku, 2); err != nil {
				t.Fatal(err)
			}
			req := inventory.Request{SKU: sku, Quantity: 2, UserID: "u", IdempotencyKey: "K"}
			first, err := r.svc.PlaceOrder(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			r.gs.mu.Lock()
			r.gs.loseAt = r.gs.calls + 1
			r.gs.mu.Unlock()
			again, err := r.svc.PlaceOrder(ctx, req)
			if err != nil || again.ID != first.ID {
				t.Errorf("replay whose read-only commit answer was lost: %v / %s, want a replay of %s", err, again.ID, first.ID)
			}
			r.gs.mu.Lock()
			r.gs.loseAt = r.gs.calls + 1
			r.gs.mu.Unlock()
			_, err = r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "v"})
			if !errors.Is(err, inventory.ErrSoldOut) {
				t.Errorf("sold out, the batch wrote nothing, commit answer lost: %v, want sold out", err)
			}
		})
	}
}

// TestBatchedPanicAnswersBatchAndFreesSKU: the batch [A, B] panics on its
// leader A's goroutine (net/http recovers a handler's panic and the process
// goes on). B, in the batch, is answered, and the lead is handed on, so a
// later order of the SKU is served: B does not wait forever, and the SKU's
// queue is not left led by no one (every later order answered busy).
func TestBatchedPanicAnswersBatchAndFreesSKU(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			r := newBatchRig(t, engine, sales.WithOrderTimeout(300*time.Millisecond))
			ctx := context.Background()
			const sku = "bx-panic"
			if err := r.svc.StartSale(ctx, sku, 100); err != nil {
				t.Fatal(err)
			}
			r.gs.panicAt = 2
			// A's goroutine recovers its panic, as net/http would.
			r.gs.gate = true
			holder := r.place("holder", inventory.Request{SKU: sku, Quantity: 1, UserID: "holder"})
			<-r.gs.entered
			recovered := make(chan any, 1)
			go func() {
				defer func() { recovered <- recover() }()
				_, _ = r.svc.PlaceOrder(named("A"), inventory.Request{SKU: sku, Quantity: 1, UserID: "a"})
			}()
			for n := range r.obs.waiting {
				if n == "A" {
					break
				}
			}
			b := r.place("B", inventory.Request{SKU: sku, Quantity: 1, UserID: "b"})
			for n := range r.obs.waiting {
				if n == "B" {
					break
				}
			}
			close(r.gs.release)
			if a := <-holder; a.err != nil {
				t.Fatalf("holder: %v", a.err)
			}
			if p := <-recovered; p == nil {
				t.Fatal("A did not panic")
			}
			// A later order, on its own: stock is there.
			_, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "d"})
			if err != nil {
				t.Errorf("an order after the panic: %v, want 201 (100 units left)", err)
			}
			// B's deadline passed before D's began: B is answered, and at
			// once, not left waiting (a hang). The bound is generous: on a
			// loaded 2-core machine the answer can trail D's by a
			// scheduling delay (CI).
			select {
			case a := <-b:
				t.Logf("B answered %+v", a)
			case <-time.After(5 * time.Second):
				t.Errorf("B, in the panicked batch, is still waiting 5 s after D was answered, long past its deadline (hang)")
			}
		})
	}
}

// TestBatchedWaitLeavesTimeToRun: a batch wait longer than the order
// timeout (cmd/stock refuses it; a library caller may still pass it): the
// leader waits at most half of what its deadline leaves, so a lone order,
// with stock there, is served instead of waiting for a batch that never
// fills and answering busy.
func TestBatchedWaitLeavesTimeToRun(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db := testdb.New(t, engine, 4)
			ctx := context.Background()
			svc := sales.NewService(db, batched.New(db, batched.WithWait(time.Hour)),
				sales.WithOrderTimeout(200*time.Millisecond))
			if err := svc.StartSale(ctx, "bx-wait", 10); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "bx-wait", Quantity: 1, UserID: "u"}); err != nil {
				t.Errorf("a lone order, 10 units there: %v, want 201", err)
			}
		})
	}
}
