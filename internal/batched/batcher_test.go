package batched

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// gatedRunner is a batchRunner that records each batch and holds it until
// the test releases it, so the test decides what queues meanwhile.
type gatedRunner struct {
	entered chan []*batchOrder // a batch started
	release chan struct{}      // let one batch finish
	mu      sync.Mutex
	ctxs    []context.Context
}

func newGatedRunner() *gatedRunner {
	return &gatedRunner{entered: make(chan []*batchOrder, 100), release: make(chan struct{})}
}

func (g *gatedRunner) run(ctx context.Context, batch []*batchOrder) []batchResult {
	g.mu.Lock()
	g.ctxs = append(g.ctxs, ctx)
	g.mu.Unlock()
	g.entered <- batch
	<-g.release
	results := make([]batchResult, len(batch))
	for i, o := range batch {
		results[i] = batchResult{order: o.order}
	}
	return results
}

// submitted is an order submitted on its own goroutine, with its answer.
type submitted struct {
	o      *batchOrder
	answer chan batchResult
}

// harness submits orders one at a time: each is in its queue before the
// next is submitted (the batcher's queued hook says so).
type harness struct {
	t      *testing.T
	b      *batcher
	queued chan *batchOrder
	wg     sync.WaitGroup
}

func newHarness(t *testing.T, maxSize int, run batchRunner) *harness {
	h := &harness{t: t, b: newBatcher(maxSize, 0, run), queued: make(chan *batchOrder, 1000)}
	h.b.queued = func(o *batchOrder) { h.queued <- o }
	t.Cleanup(h.wg.Wait)
	return h
}

func (h *harness) submit(ctx context.Context, id string, quantity int64) submitted {
	h.t.Helper()
	return h.submitOrder(newBatchOrder(ctx, inventory.Order{ID: id, SKU: "s", Quantity: quantity}, "", nil, 0))
}

// submitOrder submits o on its own goroutine and waits until it is queued.
func (h *harness) submitOrder(o *batchOrder) submitted {
	h.t.Helper()
	s := submitted{o: o, answer: make(chan batchResult, 1)}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		order, err := h.b.submit(o)
		s.answer <- batchResult{order: order, err: err}
	}()
	if q := <-h.queued; q != o {
		h.t.Fatalf("queued %s, want %s", q.order.ID, o.order.ID)
	}
	return s
}

func ids(batch []*batchOrder) []string {
	var out []string
	for _, o := range batch {
		out = append(out, o.order.ID)
	}
	return out
}

func wantBatch(t *testing.T, g *gatedRunner, want ...string) {
	t.Helper()
	if got := ids(<-g.entered); !slices.Equal(got, want) {
		t.Fatalf("batch %v, want %v", got, want)
	}
}

func wantOwnOrder(t *testing.T, s submitted) {
	t.Helper()
	r := <-s.answer
	if r.err != nil || r.order.ID != s.o.order.ID {
		t.Errorf("order %s answered %+v, %v", s.o.order.ID, r.order, r.err)
	}
}

// TestBatcherGroupsWhatQueuedInArrivalOrder: the first order runs alone;
// what queues while it runs is the next batch, in arrival order, and each
// buyer gets its own answer.
func TestBatcherGroupsWhatQueuedInArrivalOrder(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	ctx := context.Background()
	first := h.submit(ctx, "o0", 1)
	wantBatch(t, g, "o0")
	var rest []submitted
	for i := 1; i <= 5; i++ {
		rest = append(rest, h.submit(ctx, fmt.Sprintf("o%d", i), 1))
	}
	g.release <- struct{}{}
	wantOwnOrder(t, first)
	wantBatch(t, g, "o1", "o2", "o3", "o4", "o5")
	g.release <- struct{}{}
	for _, s := range rest {
		wantOwnOrder(t, s)
	}
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if len(h.b.queues) != 0 {
		t.Errorf("an idle batcher keeps %d queues", len(h.b.queues))
	}
}

// TestBatcherMaxSize: no batch holds more than max orders; the rest wait
// for the next one, still in arrival order.
func TestBatcherMaxSize(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 2, g.run)
	ctx := context.Background()
	all := []submitted{h.submit(ctx, "o0", 1)}
	wantBatch(t, g, "o0")
	for i := 1; i <= 5; i++ {
		all = append(all, h.submit(ctx, fmt.Sprintf("o%d", i), 1))
	}
	for _, want := range [][]string{{"o1", "o2"}, {"o3", "o4"}, {"o5"}} {
		g.release <- struct{}{}
		wantBatch(t, g, want...)
	}
	g.release <- struct{}{}
	for _, s := range all {
		wantOwnOrder(t, s)
	}
}

// TestBatcherDeadlines: an order whose deadline passes while queued answers
// busy at once and leaves the queue; a batch runs under the earliest
// deadline among its orders.
func TestBatcherDeadlines(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	first := h.submit(context.Background(), "o0", 1)
	wantBatch(t, g, "o0")

	gone, cancel := context.WithCancel(context.Background())
	quitter := h.submit(gone, "quitter", 1)
	now := time.Now()
	late, cancelLate := context.WithDeadline(context.Background(), now.Add(time.Hour))
	defer cancelLate()
	early, cancelEarly := context.WithDeadline(context.Background(), now.Add(time.Minute))
	defer cancelEarly()
	o2 := h.submit(late, "o2", 1)
	o3 := h.submit(early, "o3", 1)

	cancel()
	if r := <-quitter.answer; !errors.Is(r.err, inventory.ErrBusy) || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("an order that gave up while queued answered %v, want busy", r.err)
	}
	g.release <- struct{}{}
	wantOwnOrder(t, first)
	wantBatch(t, g, "o2", "o3")
	g.mu.Lock()
	d, ok := g.ctxs[1].Deadline()
	g.mu.Unlock()
	if want, _ := early.Deadline(); !ok || !d.Equal(want) {
		t.Errorf("batch deadline %v (%v), want the earliest, %v", d, ok, want)
	}
	g.release <- struct{}{}
	wantOwnOrder(t, o2)
	wantOwnOrder(t, o3)
}

// TestBatcherExpiredInBatchIsDropped: an order whose deadline passed before
// its batch was taken answers busy and is not in the batch.
func TestBatcherExpiredInBatchIsDropped(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	first := h.submit(context.Background(), "o0", 1)
	wantBatch(t, g, "o0")
	o1 := h.submit(context.Background(), "o1", 1)
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	// Its goroutine may see its deadline before or after the batch is
	// taken: either way it answers busy and is not in the batch.
	expired := h.submit(past, "expired", 1)
	o3 := h.submit(context.Background(), "o3", 1)
	g.release <- struct{}{}
	wantOwnOrder(t, first)
	wantBatch(t, g, "o1", "o3")
	g.release <- struct{}{}
	wantOwnOrder(t, o1)
	wantOwnOrder(t, o3)
	if r := <-expired.answer; !errors.Is(r.err, inventory.ErrBusy) {
		t.Errorf("expired order answered %v, want busy", r.err)
	}
}

// TestBatcherSKUsAreIndependent: a batch in flight on one SKU holds up no
// order of another.
func TestBatcherSKUsAreIndependent(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	first := h.submit(context.Background(), "o0", 1)
	wantBatch(t, g, "o0")
	other := newBatchOrder(context.Background(), inventory.Order{ID: "other", SKU: "t", Quantity: 1}, "", nil, 0)
	answered := make(chan error, 1)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		_, err := h.b.submit(other)
		answered <- err
	}()
	<-h.queued
	wantBatch(t, g, "other")
	g.release <- struct{}{}
	g.release <- struct{}{}
	if err := <-answered; err != nil {
		t.Error(err)
	}
	wantOwnOrder(t, first)
}

// fitInArrivalOrder runs a fitter over quantities and returns which it
// accepted and their total.
func fitInArrivalOrder(quantities []int64, available int64) (accepted []bool, total int64) {
	f := fitter{available: available}
	accepted = make([]bool, len(quantities))
	for i, q := range quantities {
		accepted[i] = f.take(q)
	}
	return accepted, f.total
}

func TestFitInArrivalOrder(t *testing.T) {
	for _, c := range []struct {
		quantities []int64
		available  int64
		want       []bool
		total      int64
	}{
		{[]int64{1, 2, 3}, 10, []bool{true, true, true}, 6},
		{[]int64{1, 2, 3}, 3, []bool{true, true, false}, 3},
		// A larger order that does not fit is refused whole; a later,
		// smaller one still gets what is left.
		{[]int64{3, 2, 1, 2}, 4, []bool{true, false, true, false}, 4},
		{[]int64{2, 2}, 1, []bool{false, false}, 0},
		{[]int64{2, 1}, 0, []bool{false, false}, 0},
	} {
		got, total := fitInArrivalOrder(c.quantities, c.available)
		if !slices.Equal(got, c.want) || total != c.total {
			t.Errorf("fit(%v, %d) = %v, %d; want %v, %d", c.quantities, c.available, got, total, c.want, c.total)
		}
	}
}

// fakeBatchStore is a one-SKU database in memory for the batch's decision
// logic: a transaction works on a copy and a commit keeps it.
type fakeBatchStore struct {
	mu sync.Mutex
	st fakeState
	// beforeCommit, when set, runs before a commit and may fail it.
	beforeCommit func(st *fakeState) error
}

type fakeState struct {
	available int64
	orders    map[string]inventory.Order
	keys      map[string]inventory.IdempotencyRecord
	buyers    map[string]int64 // units per buyer (PER_USER_LIMIT)
}

func (s fakeState) clone() fakeState {
	c := fakeState{available: s.available, orders: map[string]inventory.Order{}, keys: map[string]inventory.IdempotencyRecord{}}
	for k, v := range s.orders {
		c.orders[k] = v
	}
	for k, v := range s.keys {
		c.keys[k] = v
	}
	c.buyers = maps.Clone(s.buyers)
	return c
}

func newFakeBatchStore(available int64) *fakeBatchStore {
	return &fakeBatchStore{st: fakeState{available: available, orders: map[string]inventory.Order{}, keys: map[string]inventory.IdempotencyRecord{}}}
}

func (s *fakeBatchStore) InBatchTx(ctx context.Context, fn func(context.Context, Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &fakeBatchTx{st: s.st.clone()}
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if s.beforeCommit != nil {
		if err := s.beforeCommit(&s.st); err != nil {
			return err
		}
	}
	s.st = tx.st
	return nil
}

func (s *fakeBatchStore) FindOrder(_ context.Context, id string) (inventory.Order, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.st.orders[id]
	return o, ok, nil
}

type fakeBatchTx struct{ st fakeState }

func (t *fakeBatchTx) DeductIfAvailable(_ context.Context, _ string, total int64) (bool, error) {
	if t.st.available < total {
		return false, nil
	}
	t.st.available -= total
	return true, nil
}

// DeductEach deducts from the one stock the fake has, SKU after SKU.
func (t *fakeBatchTx) DeductEach(ctx context.Context, skus []string, totals []int64) ([]Deduction, error) {
	out := make([]Deduction, len(skus))
	for i := range skus {
		out[i] = Deduction{Exists: true, Level: inventory.Level{Available: t.st.available}}
		out[i].Deducted, _ = t.DeductIfAvailable(ctx, skus[i], totals[i])
	}
	return out, nil
}

// DeductEachSkippingHeld is DeductEach: nothing else holds the fake's rows.
func (t *fakeBatchTx) DeductEachSkippingHeld(ctx context.Context, skus []string, totals []int64) ([]Deduction, error) {
	return t.DeductEach(ctx, skus, totals)
}

func (t *fakeBatchTx) LockLevel(context.Context, string) (inventory.Level, error) {
	return inventory.Level{Available: t.st.available}, nil
}

func (t *fakeBatchTx) FindIdempotencyKeys(_ context.Context, keys []string) (map[string]inventory.IdempotencyRecord, error) {
	out := map[string]inventory.IdempotencyRecord{}
	for _, k := range keys {
		if r, ok := t.st.keys[k]; ok {
			out[k] = r
		}
	}
	return out, nil
}

// ResolveOrder is final here: the fake's transactions run one at a time.
func (t *fakeBatchTx) ResolveOrder(_ context.Context, _, id string) (inventory.Order, bool, error) {
	o, ok := t.st.orders[id]
	return o, ok, nil
}

func (t *fakeBatchTx) GetOrder(_ context.Context, id string) (inventory.Order, error) {
	o, ok := t.st.orders[id]
	if !ok {
		return inventory.Order{}, fmt.Errorf("no order %s", id)
	}
	return o, nil
}

func (t *fakeBatchTx) InsertOrders(_ context.Context, orders []inventory.Order) ([]time.Time, error) {
	for _, o := range orders {
		t.st.orders[o.ID] = o
	}
	return make([]time.Time, len(orders)), nil
}

func (t *fakeBatchTx) InsertIdempotencyRecords(_ context.Context, records []inventory.IdempotencyRecord) (int, error) {
	n := 0
	for _, r := range records {
		if _, ok := t.st.keys[r.Key]; !ok {
			t.st.keys[r.Key] = r
			n++
		}
	}
	return n, nil
}

func (t *fakeBatchTx) LockBuyers(_ context.Context, _ string, users []string) (map[string]int64, error) {
	held := map[string]int64{}
	for _, u := range users {
		if n, ok := t.st.buyers[u]; ok {
			held[u] = n
		}
	}
	return held, nil
}

func (t *fakeBatchTx) ClaimFirstUnits(_ context.Context, _ string, claims map[string]int64) ([]string, error) {
	if t.st.buyers == nil {
		t.st.buyers = map[string]int64{}
	}
	var created []string
	for u, q := range claims {
		if _, ok := t.st.buyers[u]; !ok {
			t.st.buyers[u] = q
			created = append(created, u)
		}
	}
	return created, nil
}

func (t *fakeBatchTx) ClaimUnitsOf(_ context.Context, _ string, claims, _ map[string]int64, limit int64) (bool, error) {
	if t.st.buyers == nil {
		t.st.buyers = map[string]int64{}
	}
	for u, q := range claims {
		if t.st.buyers[u]+q > limit {
			return false, nil
		}
		t.st.buyers[u] += q
	}
	return true, nil
}

func (t *fakeBatchTx) ReleaseUnitsOf(_ context.Context, _ string, units map[string]int64) error {
	for u, q := range units {
		t.st.buyers[u] = max(t.st.buyers[u]-q, 0)
	}
	return nil
}

func batchOf(orders ...*batchOrder) []*batchOrder { return orders }

// order is an order on SKU s. Its fingerprint stands in for the one the
// Service computes from the request: the same for the same quantity and
// body, different otherwise.
func order(id string, quantity int64, key, body string) *batchOrder {
	fingerprint := fmt.Appendf(nil, "s/%d/%s", quantity, body)
	return newBatchOrder(context.Background(), inventory.Order{ID: id, SKU: "s", Quantity: quantity, UserID: body}, key, fingerprint, 0)
}

// TestBatchSoldOutAcceptsInArrivalOrderWhileTheyFit: when the stock cannot
// cover the batch, the orders are taken in arrival order while each fits,
// the rest are sold out, and the stock deducted is what the orders hold.
func TestBatchSoldOutAcceptsInArrivalOrderWhileTheyFit(t *testing.T) {
	store := newFakeBatchStore(4)
	b := New(store)
	batch := batchOf(order("a", 3, "", "u"), order("b", 2, "", "u"), order("c", 1, "", "u"), order("d", 2, "", "u"))
	results := b.runBatch(context.Background(), batch, false)
	for i, want := range []error{nil, inventory.ErrSoldOut, nil, inventory.ErrSoldOut} {
		if got := results[i].err; !errors.Is(got, want) || (want == nil && got != nil) {
			t.Errorf("order %s: %v, want %v", batch[i].order.ID, got, want)
		}
	}
	if store.st.available != 0 || len(store.st.orders) != 2 {
		t.Errorf("available %d, %d orders; want 0 and 2", store.st.available, len(store.st.orders))
	}
}

// TestBatchDuplicateKeys: two orders with one key in a batch make one order;
// the second gets the first's answer, and a different body under the key is
// an idempotency conflict. A key the database knows is replayed.
func TestBatchDuplicateKeys(t *testing.T) {
	store := newFakeBatchStore(10)
	store.st.orders["old"] = inventory.Order{ID: "old", SKU: "s", Quantity: 1, UserID: "u"}
	store.st.keys["known"] = inventory.IdempotencyRecord{Key: "known", SKU: "s", RequestHash: order("", 1, "known", "u").fingerprint, OrderID: "old"}
	b := New(store)
	batch := batchOf(
		order("a", 2, "k", "u"),
		order("b", 2, "k", "u"),     // a retry of a
		order("c", 2, "k", "other"), // the key reused for another request
		order("d", 1, "known", "u"), // a retry of an order the database has
		order("e", 1, "", "u"),
	)
	results := b.runBatch(context.Background(), batch, false)
	if results[0].err != nil || results[0].order.ID != "a" {
		t.Errorf("a: %+v", results[0])
	}
	if results[1].err != nil || results[1].order.ID != "a" {
		t.Errorf("b should get a's order: %+v", results[1])
	}
	if !errors.Is(results[2].err, inventory.ErrIdempotencyConflict) {
		t.Errorf("c: %v, want an idempotency conflict", results[2].err)
	}
	if results[3].err != nil || results[3].order.ID != "old" {
		t.Errorf("d should replay the known order: %+v", results[3])
	}
	if results[4].err != nil || results[4].order.ID != "e" {
		t.Errorf("e: %+v", results[4])
	}
	if store.st.available != 7 || len(store.st.orders) != 3 || store.st.keys["k"].OrderID != "a" {
		t.Errorf("available %d, orders %v, key k %+v", store.st.available, store.st.orders, store.st.keys["k"])
	}
}

// TestBatchKeyTakenConcurrently: a key committed by another instance
// between the batch's lookup and its insert makes the batch run again, and
// the retry replays that instance's order instead of making a second one.
func TestBatchKeyTakenConcurrently(t *testing.T) {
	store := newFakeBatchStore(10)
	var once sync.Once
	store.beforeCommit = func(st *fakeState) error {
		var err error
		once.Do(func() {
			// The other instance's order, committed first.
			st.available--
			st.orders["theirs"] = inventory.Order{ID: "theirs", SKU: "s", Quantity: 1, UserID: "u"}
			st.keys["k"] = inventory.IdempotencyRecord{Key: "k", SKU: "s", RequestHash: order("", 1, "k", "u").fingerprint, OrderID: "theirs"}
			err = fmt.Errorf("%w: the insert of key k conflicted", errKeyTaken)
		})
		return err
	}
	b := New(store)
	batch := batchOf(order("mine", 1, "k", "u"), order("e", 1, "", "u"))
	results := b.runBatch(context.Background(), batch, false)
	if results[0].err != nil || results[0].order.ID != "theirs" {
		t.Errorf("the key's order is theirs; got %+v", results[0])
	}
	if results[1].err != nil || results[1].order.ID != "e" {
		t.Errorf("e: %+v", results[1])
	}
	if store.st.available != 8 || len(store.st.orders) != 2 {
		t.Errorf("available %d, orders %v", store.st.available, store.st.orders)
	}
}

// TestBatchCommitOutcomeUnknown: a batch whose commit answer was lost is
// resolved by its orders' ids: found, every order has its answer; not
// found (the lookup is final), every order was not taken, and says so
// (unavailable, not unknown).
func TestBatchCommitOutcomeUnknown(t *testing.T) {
	for _, landed := range []bool{true, false} {
		t.Run(fmt.Sprintf("landed=%v", landed), func(t *testing.T) {
			store := newFakeBatchStore(10)
			b := New(store)
			wrapped := &lostCommit{fakeBatchStore: store, landed: landed}
			b.store = wrapped
			results := b.runBatch(context.Background(), batchOf(order("a", 1, "", "u"), order("b", 1, "", "u")), false)
			for _, r := range results {
				if landed && r.err != nil {
					t.Errorf("the commit landed, yet %v", r.err)
				}
				if !landed && (!errors.Is(r.err, inventory.ErrUnavailable) || errors.Is(r.err, inventory.ErrOutcomeUnknown)) {
					t.Errorf("the commit did not land, yet %+v", r)
				}
			}
		})
	}
}

// lostCommit loses the answer of its first commit, which lands or not.
type lostCommit struct {
	*fakeBatchStore
	landed bool
	lost   bool
}

func (l *lostCommit) InBatchTx(ctx context.Context, fn func(context.Context, Tx) error) error {
	if l.lost {
		l.beforeCommit = nil
		return l.fakeBatchStore.InBatchTx(ctx, fn)
	}
	l.lost = true
	l.beforeCommit = func(*fakeState) error {
		if l.landed {
			return nil
		}
		return errors.New("connection reset")
	}
	err := l.fakeBatchStore.InBatchTx(ctx, fn)
	if err == nil || !errors.Is(err, inventory.ErrConflict) {
		return fmt.Errorf("%w: %v", inventory.ErrOutcomeUnknown, err)
	}
	return err
}

// TestBatcherWaitEndsWhenFull: with a max wait, the leader of an idle SKU
// waits for more orders, and takes them as soon as the batch is full (the
// wait here is an hour: the test would hang if the full batch did not end
// it).
func TestBatcherWaitEndsWhenFull(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 3, g.run)
	h.b.wait = time.Hour
	ctx := context.Background()
	all := []submitted{h.submit(ctx, "o0", 1), h.submit(ctx, "o1", 1), h.submit(ctx, "o2", 1)}
	wantBatch(t, g, "o0", "o1", "o2")
	g.release <- struct{}{}
	for _, s := range all {
		wantOwnOrder(t, s)
	}
}

// TestBatcherWaitingLeaderGivesUp: a leader whose deadline passes while it
// waits for more orders answers busy and hands the lead to the next order.
func TestBatcherWaitingLeaderGivesUp(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 2, g.run)
	h.b.wait = time.Hour
	gone, cancel := context.WithCancel(context.Background())
	leader := h.submit(gone, "leader", 1)
	cancel()
	if r := <-leader.answer; !errors.Is(r.err, inventory.ErrBusy) {
		t.Fatalf("leader answered %v, want busy", r.err)
	}
	// The SKU is idle again: the next order leads, and two fill its batch.
	o1 := h.submit(context.Background(), "o1", 1)
	o2 := h.submit(context.Background(), "o2", 1)
	wantBatch(t, g, "o1", "o2")
	g.release <- struct{}{}
	wantOwnOrder(t, o1)
	wantOwnOrder(t, o2)
}

// whoKey names the order a context belongs to, so that a test can tell
// whose context a batch runs under (its leader's values).
type whoKey struct{}

func ctxOf(name string) context.Context {
	return context.WithValue(context.Background(), whoKey{}, name)
}

// cancelOnWake is a QueueObserver that cancels one order's context the
// first time another goroutine wakes it: when it is told to lead, under the
// batcher's lock, before the order can take the lead.
type cancelOnWake struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (cancelOnWake) Joining(context.Context) {}
func (cancelOnWake) Waiting(context.Context) {}
func (c cancelOnWake) Woken(ctx context.Context) {
	if ctx == c.ctx {
		c.cancel()
	}
}

// TestBatcherExpiredNextLeaderHandsOn: an order told to lead whose deadline
// has passed answers busy, runs nothing, and hands the lead on to the next
// queued order, which takes the batch without it. The order's context ends
// as it is told to lead (the observer cancels it then), so whichever its
// goroutine sees first, the lead or its own end, it cannot leave the queue
// as a merely queued order does: it is the next leader.
func TestBatcherExpiredNextLeaderHandsOn(t *testing.T) {
	g := newGatedRunner()
	h := newHarness(t, 256, g.run)
	doomedCtx, cancel := context.WithCancel(ctxOf("doomed"))
	defer cancel()
	h.b.observe = cancelOnWake{ctx: doomedCtx, cancel: cancel}

	first := h.submit(ctxOf("o0"), "o0", 1)
	wantBatch(t, g, "o0")
	doomed := h.submit(doomedCtx, "doomed", 1)
	o2 := h.submit(ctxOf("o2"), "o2", 1)
	o3 := h.submit(ctxOf("o3"), "o3", 1)
	// o0's batch ends: its leader tells doomed to lead, ending its context.
	g.release <- struct{}{}
	wantOwnOrder(t, first)
	wantBatch(t, g, "o2", "o3")

	// The batch runs under its new leader's context, o2's, not doomed's.
	g.mu.Lock()
	leader := g.ctxs[1].Value(whoKey{})
	g.mu.Unlock()
	if leader != "o2" {
		t.Errorf("the batch after doomed's hand-off runs under %v's context, want o2's", leader)
		g.release <- struct{}{} // doomed's goroutine runs it: let it answer
	}
	// doomed has its answer while that batch is still held: it waits for no
	// batch past its deadline.
	if r := <-doomed.answer; !errors.Is(r.err, inventory.ErrBusy) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("an order told to lead after its deadline answered %+v, %v; want busy", r.order, r.err)
	}
	if leader == "o2" {
		g.release <- struct{}{}
	}
	wantOwnOrder(t, o2)
	wantOwnOrder(t, o3)
	h.b.mu.Lock()
	defer h.b.mu.Unlock()
	if len(h.b.queues) != 0 {
		t.Errorf("the SKU's queue is still there: %+v", h.b.queues["s"])
	}
}

// TestBatchKeyBelongsToFirstAcceptedOrder: the batch decides its keys in
// arrival order as if each order came alone. A key the database has is
// compared with each order on its own; a key an earlier order was refused
// with (sold out) is free for the next request; a key an accepted order
// holds is followed by the same request and refused to another.
func TestBatchKeyBelongsToFirstAcceptedOrder(t *testing.T) {
	store := newFakeBatchStore(3)
	store.st.orders["old"] = inventory.Order{ID: "old", SKU: "s", Quantity: 2, UserID: "u"}
	store.st.keys["known"] = inventory.IdempotencyRecord{Key: "known", SKU: "s", RequestHash: order("", 2, "known", "u").fingerprint, OrderID: "old"}
	b := New(store)
	batch := batchOf(
		order("a", 1, "known", "u"), // the known key, another body: 422
		order("b", 2, "known", "u"), // the known key's own body: replay
		order("c", 4, "k", "u"),     // does not fit: sold out, k stays free
		order("d", 2, "k", "v"),     // k, another body, a fresh request: accepted
		order("e", 2, "k", "v"),     // d's retry: d's order
		order("f", 4, "k", "u"),     // c's body again, but k is d's now: 422
		order("g", 1, "j", "u"),     // fits in what d left
		order("h", 1, "", "u"),      // nothing left
	)
	results := b.runBatch(context.Background(), batch, false)
	want := []struct {
		id  string
		err error
	}{{"", inventory.ErrIdempotencyConflict}, {"old", nil}, {"", inventory.ErrSoldOut}, {"d", nil}, {"d", nil}, {"", inventory.ErrIdempotencyConflict}, {"g", nil}, {"", inventory.ErrSoldOut}}
	for i, w := range want {
		r := results[i]
		if (w.err == nil && r.err != nil) || !errors.Is(r.err, w.err) || r.order.ID != w.id {
			t.Errorf("order %s: %q, %v; want %q, %v", batch[i].order.ID, r.order.ID, r.err, w.id, w.err)
		}
	}
	if store.st.available != 0 || len(store.st.orders) != 3 || store.st.keys["k"].OrderID != "d" || store.st.keys["j"].OrderID != "g" {
		t.Errorf("available %d, orders %v, keys %v", store.st.available, store.st.orders, store.st.keys)
	}
}

// TestBatchKeysTakenOneAfterAnotherDoNotMakeBatchBusy: other instances
// commit the batch's keys one at a time, each just before the batch's
// commit, more times than the batch has attempts. Each retry replays the
// key taken, so the batch ends with every order answered, none busy.
func TestBatchKeysTakenOneAfterAnotherDoNotMakeBatchBusy(t *testing.T) {
	store := newFakeBatchStore(100)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6"}
	taken := 0
	store.beforeCommit = func(st *fakeState) error {
		if taken == len(keys)-1 {
			return nil
		}
		k := keys[taken]
		taken++
		id := "theirs-" + k
		st.available--
		st.orders[id] = inventory.Order{ID: id, SKU: "s", Quantity: 1, UserID: "u"}
		st.keys[k] = inventory.IdempotencyRecord{Key: k, SKU: "s", RequestHash: order("", 1, k, "u").fingerprint, OrderID: id}
		return fmt.Errorf("%w: the insert of key %s conflicted", errKeyTaken, k)
	}
	b := New(store, WithTxAttempts(2))
	var batch []*batchOrder
	for _, k := range keys {
		batch = append(batch, order("mine-"+k, 1, k, "u"))
	}
	results := b.runBatch(context.Background(), batch, false)
	for i, r := range results {
		want := "theirs-" + keys[i]
		if i == len(keys)-1 {
			want = "mine-" + keys[i]
		}
		if r.err != nil || r.order.ID != want {
			t.Errorf("%s: %q, %v; want %q", keys[i], r.order.ID, r.err, want)
		}
	}
	if store.st.available != 100-int64(len(keys)) || len(store.st.orders) != len(keys) {
		t.Errorf("available %d, orders %v", store.st.available, store.st.orders)
	}
}

// TestPlanBatchHoldsEachBuyerToTheLimit: with a per-user limit of 2, a
// buyer who held 1 before the batch gets one more unit and no more, in
// arrival order; another buyer's orders are decided on their own units; an
// order refused for the limit takes no stock, so a later one still fits.
func TestPlanBatchHoldsEachBuyerToTheLimit(t *testing.T) {
	ctx := context.Background()
	mk := func(id, user string, q int64) *batchOrder {
		return newBatchOrder(ctx, inventory.Order{ID: id, SKU: "s", Quantity: q, UserID: user}, "", nil, 2)
	}
	batch := batchOf(mk("1", "a", 1), mk("2", "a", 1), mk("3", "b", 2), mk("4", "b", 1), mk("5", "c", 1))
	plan, total := planBatch(batch, nil, 4, 2, map[string]int64{"a": 1})
	want := []verdict{accepted, limitReached, accepted, limitReached, accepted}
	for i, d := range plan {
		if d.verdict != want[i] {
			t.Errorf("order %d: verdict %d, want %d", i+1, d.verdict, want[i])
		}
	}
	if total != 4 {
		t.Errorf("total %d, want 4", total)
	}
}

// TestBatchClaimsBeforeTheStockAndGivesBackWhatDidNotFit: the buyers'
// units are claimed as if every order fit, before the deduction; when the
// stock then covers only some, the others are refused sold out and their
// claims given back in the same transaction. A buyer who had a row
// (held 1 of 2) is decided on it, in arrival order.
func TestBatchClaimsBeforeTheStockAndGivesBackWhatDidNotFit(t *testing.T) {
	ctx := context.Background()
	store := newFakeBatchStore(2)
	store.st.buyers = map[string]int64{"a": 1}
	b := New(store)
	mk := func(id, user string, q int64) *batchOrder {
		return newBatchOrder(ctx, inventory.Order{ID: id, SKU: "s", Quantity: q, UserID: user}, "", nil, 2)
	}
	batch := batchOf(mk("1", "a", 2), mk("2", "a", 1), mk("3", "b", 1), mk("4", "c", 1), mk("5", "d", 2))
	results := b.runBatch(ctx, batch, false)
	want := []error{inventory.ErrLimitReached, nil, nil, inventory.ErrSoldOut, inventory.ErrSoldOut}
	for i, w := range want {
		if got := results[i].err; !errors.Is(got, w) || (w == nil && got != nil) {
			t.Errorf("order %s: %v, want %v", batch[i].order.ID, got, w)
		}
	}
	wantUnits := map[string]int64{"a": 2, "b": 1, "c": 0, "d": 0}
	for u, n := range wantUnits {
		if got := store.st.buyers[u]; got != n {
			t.Errorf("buyer %s holds %d units after the batch, want %d", u, got, n)
		}
	}
	if store.st.available != 0 {
		t.Errorf("%d units left, want 0", store.st.available)
	}
}
