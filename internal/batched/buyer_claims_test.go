package batched_test

import (
	"context"
	"errors"
	"fmt"
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

// These tests drive the buyers' claims of a batch (PER_USER_LIMIT) on the
// real servers, with batches whose composition and arrival order the test
// fixes: a gate holds a first batch's transaction while the orders of the
// batch under test queue behind it, one at a time, in the order given.

// settleWait bounds every wait of these tests for something that should
// happen at once; it is a failure bound, never a synchronisation.
const settleWait = 20 * time.Second

// orderTag names an order in its context, so the queue observer can tell
// the test that it waits in its SKU's queue.
type orderTag struct{}

// queueWatch hears each tagged order the first time it waits in its SKU's
// queue (it is then in the queue, behind the orders before it).
type queueWatch struct {
	mu      sync.Mutex
	seen    map[string]bool
	waiting chan string
}

func newQueueWatch() *queueWatch {
	return &queueWatch{seen: map[string]bool{}, waiting: make(chan string, 64)}
}

func (w *queueWatch) Joining(context.Context) {}
func (w *queueWatch) Woken(context.Context)   {}
func (w *queueWatch) Waiting(ctx context.Context) {
	tag, _ := ctx.Value(orderTag{}).(string)
	if tag == "" {
		return
	}
	w.mu.Lock()
	first := !w.seen[tag]
	w.seen[tag] = true
	w.mu.Unlock()
	if first {
		w.waiting <- tag
	}
}

// gatedStore is the real store with a gate on its batch transactions:
// when armed, the next batch transaction tells entered and waits for the
// gate to open before it begins. It counts the transactions begun after
// the gate (the batch under test's attempts). afterClaim, when set, runs
// right after each ClaimFirstUnits of the transactions.
type gatedStore struct {
	batched.Store
	mu         sync.Mutex
	gate       chan struct{}
	entered    chan struct{}
	attempts   atomic.Int64
	afterClaim func(ctx context.Context)
}

func (g *gatedStore) arm() (entered, open chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.entered = make(chan struct{}), make(chan struct{}, 1)
	return g.entered, g.gate
}

func (g *gatedStore) InBatchTx(ctx context.Context, fn func(context.Context, batched.Tx) error) error {
	g.mu.Lock()
	gate, entered := g.gate, g.entered
	g.gate, g.entered = nil, nil
	after := g.afterClaim
	g.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	} else {
		g.attempts.Add(1)
	}
	return g.Store.InBatchTx(ctx, func(ctx context.Context, tx batched.Tx) error {
		if after != nil {
			tx = claimHookTx{Tx: tx, after: after}
		}
		return fn(ctx, tx)
	})
}

// claimHookTx runs after right after ClaimFirstUnits.
type claimHookTx struct {
	batched.Tx
	after func(ctx context.Context)
}

func (t claimHookTx) ClaimFirstUnits(ctx context.Context, sku string, claims map[string]int64) ([]string, error) {
	created, err := t.Tx.ClaimFirstUnits(ctx, sku, claims)
	if err == nil {
		t.after(ctx)
	}
	return created, err
}

// batchSizes records the sizes of the batches run.
type batchSizes struct {
	mu      sync.Mutex
	sizes   []int
	retries map[string]int
}

func (b *batchSizes) BatchDone(size int, _ time.Duration, _ string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, size)
}

func (b *batchSizes) Retried(_, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.retries == nil {
		b.retries = map[string]int{}
	}
	b.retries[reason]++
}

type placed struct {
	order inventory.Order
	err   error
}

// claimRig is one instance of the batched strategy with a per-user limit
// over a fresh database of the engine.
type claimRig struct {
	db    store.Store
	gated *gatedStore
	watch *queueWatch
	sizes *batchSizes
	svc   *sales.Service
}

func newClaimRig(t *testing.T, engine string, limit int64) *claimRig {
	t.Helper()
	db := testdb.New(t, engine, 8)
	return newClaimRigOn(db, limit)
}

func newClaimRigOn(db store.Store, limit int64) *claimRig {
	r := &claimRig{db: db, gated: &gatedStore{Store: db}, watch: newQueueWatch(), sizes: &batchSizes{}}
	strategy := batched.New(r.gated, batched.WithQueueObserver(r.watch), batched.WithObserver(r.sizes))
	r.svc = sales.NewService(db, strategy, sales.WithPerUserLimit(limit), sales.WithSoldOutTTL(0), sales.WithOrderTimeout(settleWait))
	return r
}

// placeInOneBatch places reqs as one batch, in that arrival order: a
// blocker order's batch is held at the gate while reqs queue one by one
// behind it, then the gate opens. It returns reqs' answers.
func (r *claimRig) placeInOneBatch(t *testing.T, sku string, reqs []inventory.Request) []placed {
	t.Helper()
	ctx := context.Background()
	entered, open := r.gated.arm()
	blocker := make(chan placed, 1)
	go func() {
		o, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "blocker"})
		blocker <- placed{o, err}
	}()
	select {
	case <-entered:
	case <-time.After(settleWait):
		t.Fatal("the blocker's batch never began")
	}
	answers := make([]chan placed, len(reqs))
	for i, req := range reqs {
		tag := fmt.Sprintf("order-%d", i)
		answers[i] = make(chan placed, 1)
		go func() {
			o, err := r.svc.PlaceOrder(context.WithValue(ctx, orderTag{}, tag), req)
			answers[i] <- placed{o, err}
		}()
		select {
		case got := <-r.watch.waiting:
			if got != tag {
				t.Fatalf("%s queued while %s was expected", got, tag)
			}
		case <-time.After(settleWait):
			t.Fatalf("%s never queued", tag)
		}
	}
	r.gated.attempts.Store(0)
	close(open)
	if b := <-blocker; b.err != nil {
		t.Fatalf("the blocker's order: %v", b.err)
	}
	out := make([]placed, len(reqs))
	for i := range reqs {
		select {
		case out[i] = <-answers[i]:
		case <-time.After(settleWait):
			t.Fatalf("order %d never answered", i)
		}
	}
	r.sizes.mu.Lock()
	sizes := append([]int(nil), r.sizes.sizes...)
	r.sizes.mu.Unlock()
	if len(sizes) < 2 || sizes[len(sizes)-1] != len(reqs) {
		t.Fatalf("batch sizes %v: the orders did not run as one batch of %d", sizes, len(reqs))
	}
	return out
}

// unitsOf reads buyer_units of users in sku's sale (absent: no row).
func unitsOf(t *testing.T, db batched.Store, sku string, users ...string) map[string]int64 {
	t.Helper()
	errReadOnly := errors.New("read only")
	var units map[string]int64
	err := db.InBatchTx(context.Background(), func(ctx context.Context, tx batched.Tx) error {
		var err error
		if units, err = tx.LockBuyers(ctx, sku, users); err != nil {
			return err
		}
		return errReadOnly
	})
	if !errors.Is(err, errReadOnly) {
		t.Fatalf("read buyer_units: %v", err)
	}
	return units
}

// TestBatchedBuyerWhoseOrderLosesItsKeyKeepsNoUnits: limit 2, buyer a
// holds 1. One batch, in arrival order:
//
//  1. a, 2 units, key K1 -> limit_reached (1+2 > 2)
//  2. a, 1 unit,  key K2 -> accepted (a holds 2)
//  3. b, 1 unit,  key K2 -> idempotency_conflict (K2 is order 2's)
//
// claimBuyers' first plan (every buyer holding 0) accepts 1 and refuses 2
// (2+1 > 2), so 3 is the first with K2 and is accepted: b, new, is
// created with 1 unit by ClaimFirstUnits. The second plan, with a's row
// read, refuses 1, accepts 2 and makes 3 conflict: b has no accepted
// order, so the "claim of a new buyer changed" check (which ranges over
// the second plan's buyers only) never sees b, and b's 1 unit is
// committed with no order behind it. b is then refused limit_reached for
// 2 units it may take.
func TestBatchedBuyerWhoseOrderLosesItsKeyKeepsNoUnits(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			r := newClaimRig(t, engine, 2)
			ctx := context.Background()
			const sku = "keyhand"
			if err := r.svc.StartSale(ctx, sku, 10); err != nil {
				t.Fatal(err)
			}
			if _, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "a"}); err != nil {
				t.Fatalf("a's first unit: %v", err)
			}
			got := r.placeInOneBatch(t, sku, []inventory.Request{
				{SKU: sku, Quantity: 2, UserID: "a", IdempotencyKey: "K1"},
				{SKU: sku, Quantity: 1, UserID: "a", IdempotencyKey: "K2"},
				{SKU: sku, Quantity: 1, UserID: "b", IdempotencyKey: "K2"},
			})
			if !errors.Is(got[0].err, inventory.ErrLimitReached) {
				t.Errorf("order 1 (a, 2, K1): %v, want limit reached", got[0].err)
			}
			if got[1].err != nil {
				t.Errorf("order 2 (a, 1, K2): %v, want taken", got[1].err)
			}
			if !errors.Is(got[2].err, inventory.ErrIdempotencyConflict) {
				t.Errorf("order 3 (b, 1, K2): %v, want an idempotency conflict", got[2].err)
			}
			units := unitsOf(t, r.db, sku, "a", "b")
			if units["a"] != 2 {
				t.Errorf("a holds %d units in buyer_units, want 2 (its two orders)", units["a"])
			}
			if units["b"] != 0 {
				t.Errorf("b holds %d units in buyer_units with no order (its only order was refused)", units["b"])
			}
			if _, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 2, UserID: "b"}); err != nil {
				t.Errorf("b, who holds nothing, orders 2 of a limit of 2: %v", err)
			}
		})
	}
}

// TestBatchedNewBuyerWhoseClaimGrowsIsDecided: limit 2, buyer a holds 1.
// One batch, in arrival order:
//
//  1. a, 2 units, key K -> limit_reached (1+2 > 2)
//  2. b, 1 unit,  key K -> taken (K is free once 1 is refused)
//  3. b, 1 unit         -> taken (b holds 2)
//
// The first plan (everyone at 0) accepts 1, makes 2 conflict on K and
// accepts 3: b is created with 1. The second plan, with a's row, gives b
// 2 units, and claimBuyers aborts with ErrConflict to "decide the batch
// again, with this buyer's row there to be read". But the abort rolls b's
// row back: every attempt finds the same, and after WithTxAttempts (5)
// every order of the batch, b's and a's and anyone else's, is answered
// busy. A retry of the same batch is busy again, deterministically.
func TestBatchedNewBuyerWhoseClaimGrowsIsDecided(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			r := newClaimRig(t, engine, 2)
			ctx := context.Background()
			const sku = "keygrow"
			if err := r.svc.StartSale(ctx, sku, 10); err != nil {
				t.Fatal(err)
			}
			if _, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "a"}); err != nil {
				t.Fatalf("a's first unit: %v", err)
			}
			got := r.placeInOneBatch(t, sku, []inventory.Request{
				{SKU: sku, Quantity: 2, UserID: "a", IdempotencyKey: "K"},
				{SKU: sku, Quantity: 1, UserID: "b", IdempotencyKey: "K"},
				{SKU: sku, Quantity: 1, UserID: "b"},
				{SKU: sku, Quantity: 1, UserID: "c"},
			})
			t.Logf("the batch ran %d transactions", r.gated.attempts.Load())
			if !errors.Is(got[0].err, inventory.ErrLimitReached) {
				t.Errorf("order 1 (a, 2, K): %v, want limit reached", got[0].err)
			}
			for i, who := range []string{"2 (b, 1, K)", "3 (b, 1)", "4 (c, 1, a bystander)"} {
				if err := got[i+1].err; err != nil {
					t.Errorf("order %s: %v, want taken", who, err)
				}
			}
			units := unitsOf(t, r.db, sku, "a", "b", "c")
			want := map[string]int64{"a": 1, "b": 2, "c": 1}
			if got[1].err != nil || got[2].err != nil {
				want["b"] = 0
			}
			if got[3].err != nil {
				want["c"] = 0
			}
			for u, n := range want {
				if units[u] != n {
					t.Errorf("%s holds %d units in buyer_units, want %d", u, units[u], n)
				}
			}
		})
	}
}

// TestBatchedSameBuyerOnTwoInstancesAtOnce: two instances' batches claim
// for the same buyer, who has a row already, at the same moment: both
// pass ClaimFirstUnits before either locks the row (LockBuyers). On
// MariaDB, INSERT IGNORE's duplicate check leaves a shared lock on the
// row in each, and each FOR UPDATE then waits for the other's: InnoDB
// picks a victim (a deadlock, ErrConflict), whose batch runs again. The
// claim holds: both orders are decided, the buyer never passes the limit,
// and buyer_units counts the buyer's orders. The deadlock costs one
// attempt (logged, not asserted). On PostgreSQL, DO NOTHING locks no
// existing row and there is none.
func TestBatchedSameBuyerOnTwoInstancesAtOnce(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, engine, 8)
			ctx := context.Background()
			const sku, limit = "twoinst", 3
			a, b := newClaimRigOn(db, limit), newClaimRigOn(db, limit)
			if err := a.svc.StartSale(ctx, sku, 10); err != nil {
				t.Fatal(err)
			}
			if _, err := a.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "u"}); err != nil {
				t.Fatalf("u's first unit: %v", err)
			}
			// Both batches' first transactions meet after ClaimFirstUnits.
			var once sync.Once
			arrived := make(chan struct{}, 2)
			both := make(chan struct{})
			var n atomic.Int32
			meet := func(context.Context) {
				if n.Add(1) > 2 {
					return
				}
				arrived <- struct{}{}
				if len(arrived) == 2 {
					once.Do(func() { close(both) })
				}
				select {
				case <-both:
				case <-time.After(5 * time.Second):
					// The other never came (it waits on this one's
					// lock): go on, the schedule did not happen.
				}
			}
			a.gated.afterClaim, b.gated.afterClaim = meet, meet
			results := make(chan placed, 2)
			for _, r := range []*claimRig{a, b} {
				go func() {
					o, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 2, UserID: "u"})
					results <- placed{o, err}
				}()
			}
			var taken, limited int
			for range 2 {
				select {
				case p := <-results:
					switch {
					case p.err == nil:
						taken++
					case errors.Is(p.err, inventory.ErrLimitReached):
						limited++
					default:
						t.Errorf("an order of u: %v, want taken or limit reached", p.err)
					}
				case <-time.After(settleWait):
					t.Fatal("an order never answered")
				}
			}
			if taken != 1 || limited != 1 {
				t.Errorf("%d taken and %d refused limit reached; want 1 and 1 (u holds 1, 2+2 > 3-1)", taken, limited)
			}
			if got := unitsOf(t, db, sku, "u")["u"]; got != 1+2*int64(taken) {
				t.Errorf("u holds %d units, want %d", got, 1+2*taken)
			}
			met := false
			select {
			case <-both:
				met = true
			default:
			}
			for _, r := range []*claimRig{a, b} {
				r.sizes.mu.Lock()
				t.Logf("retries %v (both met after ClaimFirstUnits: %v)", r.sizes.retries, met)
				r.sizes.mu.Unlock()
			}
		})
	}
}

// TestBatchedGivesBackTheClaimsTheStockDidNotCover: limit 3, buyer a holds
// 1, 2 units left. One batch: a 2, b 1 (new), c 2 (new). The claims are
// made as if all fit (a grows to 3, b and c are created), the deduction of
// 5 is refused, and under the row lock only a's order fits: b and c are
// sold out and their claims given back (ReleaseUnitsOf) in the same
// transaction. On the real servers: a holds 3, b and c nothing, and the
// stock adds up. (This is the sell-out moment of every flash sale with
// PER_USER_LIMIT: the batch whose orders do not all fit.)
func TestBatchedGivesBackTheClaimsTheStockDidNotCover(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			r := newClaimRig(t, engine, 3)
			ctx := context.Background()
			const sku = "giveback"
			if err := r.svc.StartSale(ctx, sku, 4); err != nil {
				t.Fatal(err)
			}
			if _, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "a"}); err != nil {
				t.Fatalf("a's first unit: %v", err)
			}
			// The blocker takes 1 more: 2 left for the batch.
			got := r.placeInOneBatch(t, sku, []inventory.Request{
				{SKU: sku, Quantity: 2, UserID: "a"},
				{SKU: sku, Quantity: 1, UserID: "b"},
				{SKU: sku, Quantity: 2, UserID: "c"},
			})
			if got[0].err != nil {
				t.Errorf("a, 2 of the 2 left: %v, want taken", got[0].err)
			}
			for i, who := range []string{"b", "c"} {
				if !errors.Is(got[i+1].err, inventory.ErrSoldOut) {
					t.Errorf("%s, past the stock: %v, want sold out", who, got[i+1].err)
				}
			}
			units := unitsOf(t, r.db, sku, "a", "b", "c")
			want := map[string]int64{"a": 3, "b": 0, "c": 0}
			if got[0].err != nil {
				want["a"] = 1
			}
			for u, n := range want {
				if units[u] != n {
					t.Errorf("%s holds %d units in buyer_units, want %d", u, units[u], n)
				}
			}
			audit, err := r.svc.Audit(ctx, sku)
			if err != nil {
				t.Fatal(err)
			}
			if !audit.Consistent() {
				t.Errorf("audit %+v", audit)
			}
		})
	}
}

// TestBatchedOrderPastTheStockIsSoldOutWithALimit: the plainest sold-out
// answer with PER_USER_LIMIT. A new buyer's order after the last unit is
// claimed as if it fit, the deduction is refused, and its claim is given
// back (ReleaseUnitsOf) before it is answered sold out. On MariaDB that
// statement is built with its WHEN arguments twice (11 arguments for 7
// placeholders with two buyers, 6 for 4 with one): every batch that gives
// a claim back fails, and its orders, the sold-out ones and the ones that
// fit alike, are answered 503 unavailable.
func TestBatchedOrderPastTheStockIsSoldOutWithALimit(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			r := newClaimRig(t, engine, 2)
			ctx := context.Background()
			const sku = "last"
			if err := r.svc.StartSale(ctx, sku, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "first"}); err != nil {
				t.Fatalf("the only unit: %v", err)
			}
			_, err := r.svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "second"})
			if !errors.Is(err, inventory.ErrSoldOut) {
				t.Errorf("an order past the stock: %v, want sold out", err)
			}
			if got := unitsOf(t, r.db, sku, "second")["second"]; got != 0 {
				t.Errorf("the refused buyer holds %d units", got)
			}
		})
	}
}
