package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// countingSink is the real database as a Sink that records, of every
// call, how many SKUs and orders it carried.
type countingSink struct {
	reservation.Sink
	mu    sync.Mutex
	calls []sinkCall
}

type sinkCall struct{ skus, orders int }

func (c *countingSink) PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	call := sinkCall{skus: len(reservation.BatchSKUs(batches))}
	for _, b := range batches {
		call.orders += len(b.Orders)
	}
	c.mu.Lock()
	c.calls = append(c.calls, call)
	c.mu.Unlock()
	return c.Sink.PersistReservedEach(ctx, batches)
}

func (c *countingSink) seen() []sinkCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// TestOneTransactionWritesTheOrdersOfManySKUs: a catalog's orders, one or
// two a SKU, are written a round of SKUs to a transaction, not a
// transaction a SKU (issue 38: the drain was commit-bound in a catalog).
func TestOneTransactionWritesTheOrdersOfManySKUs(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			s := newSale(t, engine)
			skus := startCatalog(t, s, "drain", 300, 5)
			for i, sku := range skus {
				for j := range 1 + i%2 {
					if _, err := s.order(sku, 1, fmt.Sprintf("u-%d-%d", i, j), ""); err != nil {
						t.Fatal(err)
					}
				}
			}
			sink := &countingSink{Sink: s.db}
			s.consume(sink)
			s.seen.waitFor(t, 450)
			calls := sink.seen()
			widest := 0
			for _, c := range calls {
				widest = max(widest, c.skus)
			}
			// 300 SKUs' streams are read 256 a round: two rounds.
			if len(calls) > 4 || widest < 100 {
				t.Errorf("300 SKUs' orders took %d transactions (%+v), want a few of many SKUs each", len(calls), calls)
			}
			for i, sku := range skus {
				a, err := s.db.Audit(context.Background(), sku)
				if err != nil || !a.Consistent() || a.Orders != int64(1+i%2) || a.Available != 5-a.Ordered {
					t.Fatalf("%s: audit %+v %v, want %d orders, consistent", sku, a, err, 1+i%2)
				}
			}
		})
	}
}

// TestATransactionTakesAtMostTwoThousandOrders: a round that read more
// orders than a transaction takes (five SKUs of 512) writes them in
// several, on both engines.
func TestATransactionTakesAtMostTwoThousandOrders(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			s := newSale(t, engine)
			skus := startCatalog(t, s, "wide", 6, 600)
			for i, sku := range skus[:5] {
				for j := range 600 {
					if _, err := s.order(sku, 1, fmt.Sprintf("u-%d", j), ""); err != nil {
						t.Fatal(err)
					}
				}
				// The sixth SKU's orders, for the consumer of large
				// batches below.
				if _, err := s.order(skus[5], 120, fmt.Sprintf("big-%d", i), ""); err != nil {
					t.Fatal(err)
				}
			}
			sink := &countingSink{Sink: s.db}
			s.consume(sink)
			s.seen.waitFor(t, 3005)
			calls := sink.seen()
			for _, c := range calls {
				if c.orders > 2048 {
					t.Errorf("a transaction of %d orders, want at most 2048: %+v", c.orders, calls)
				}
			}
			if len(calls) < 2 {
				t.Errorf("3,005 orders in %d transactions, want them split: %+v", len(calls), calls)
			}
			for _, sku := range skus {
				if a, err := s.db.Audit(context.Background(), sku); err != nil || !a.Consistent() || a.Available != 0 {
					t.Fatalf("%s: audit %+v %v, want sold out", sku, a, err)
				}
			}
		})
	}
}

// TestABatchLargerThanATransactionIsCut: WithBatch above what a transaction
// takes reads 2,048 entries a round, so a backlog of one SKU is written in
// transactions of at most that.
func TestABatchLargerThanATransactionIsCut(t *testing.T) {
	s := newSale(t, "mysql")
	s.start("backlog", 2100)
	var wg sync.WaitGroup
	errs := make(chan error, 2100)
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < 2100; i += 16 {
				if _, err := s.order("backlog", 1, fmt.Sprintf("u-%d", i), ""); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sink := &countingSink{Sink: s.db}
	s.consume(sink, reservation.WithBatch(9000))
	if a := s.drained("backlog", 2100); !a.Consistent() || a.Available != 0 || a.Orders != 2100 {
		t.Fatalf("audit %+v, want 2,100 orders, sold out", a)
	}
	for _, c := range sink.seen() {
		if c.orders > 2048 {
			t.Fatalf("a transaction of %d orders, want at most 2,048: %+v", c.orders, sink.seen())
		}
	}
}

// slowSKUSink is the real database as a Sink whose calls that carry the SKU
// slow never commit: they wait for their deadline. Every other call's SKUs
// are in written once it returned.
type slowSKUSink struct {
	reservation.Sink
	slow    string
	mu      sync.Mutex
	written []string
	cut     chan struct{} // closed when a slow call has ended
	once    sync.Once
}

func (s *slowSKUSink) PersistReservedEach(ctx context.Context, batches []reservation.SaleBatch) ([]reservation.SaleBatchOutcome, error) {
	skus := reservation.BatchSKUs(batches)
	if slices.Contains(skus, s.slow) {
		<-ctx.Done()
		s.once.Do(func() { close(s.cut) })
		return nil, fmt.Errorf("%w: slow (test): %w", inventory.ErrUnavailable, ctx.Err())
	}
	out, err := s.Sink.PersistReservedEach(ctx, batches)
	if err == nil {
		s.mu.Lock()
		s.written = append(s.written, skus...)
		s.mu.Unlock()
	}
	return out, err
}

// TestASlowTransactionDoesNotHoldBackTheOthersAcknowledgements: a round's
// transactions are acknowledged each as it commits. When one of them hangs
// until its deadline, the entries the others wrote are acknowledged and
// deleted all the same; before (found by review), one deadline covered
// the round and its acknowledgements, which then failed, so the written
// entries stayed pending, were written again as nothing every round, and
// were claimed by other instances.
func TestASlowTransactionDoesNotHoldBackTheOthersAcknowledgements(t *testing.T) {
	s := newSale(t, "postgres")
	skus := startCatalog(t, s, "slowack", 5, 600)
	for _, sku := range skus {
		for j := range 512 {
			if _, err := s.order(sku, 1, fmt.Sprintf("u-%d", j), ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Five SKUs of 512: four to a transaction, the fifth alone; the slow
	// one is the fifth or shares a transaction with others.
	sink := &slowSKUSink{Sink: s.db, slow: skus[2], cut: make(chan struct{})}
	s.consume(sink, reservation.WithWriteLimit(300*time.Millisecond))
	<-sink.cut
	sink.mu.Lock()
	written := slices.Clone(sink.written)
	sink.mu.Unlock()
	if len(written) == 0 {
		t.Fatal("no transaction committed beside the slow one")
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, sku := range written {
		for {
			n, err := s.rdb.XLen(context.Background(), "stock:{"+sku+"}:orders").Result()
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d written entries still in its stream while another transaction hangs", sku, n)
			}
			<-time.After(20 * time.Millisecond)
		}
	}
}

// TestEachSaleOfABatchIsJudgedAlone: one call carries a batch of the
// current sale, one of an older sale, one of a sale not committed yet and
// one of a SKU the database has no sale of. The first is written, each of
// the others refused with its own error, and nothing of them is written.
func TestEachSaleOfABatchIsJudgedAlone(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 4)
			epochs := map[string]int64{}
			for _, sku := range []string{"each-current", "each-old", "each-ahead"} {
				e, err := db.StartSaleWith(ctx, inventory.SaleStart{SKU: sku, Available: 10})
				if err != nil {
					t.Fatal(err)
				}
				epochs[sku] = e
			}
			one := func(sku string) []inventory.Order {
				return []inventory.Order{{ID: uuid.NewString(), SKU: sku, Quantity: 2, UserID: "u", Strategy: strategies.NameRedisReserve, State: inventory.OrderFinal}}
			}
			batches := []reservation.SaleBatch{
				{SKU: "each-old", Epoch: epochs["each-old"] - 1, Orders: one("each-old")},
				{SKU: "each-current", Epoch: epochs["each-current"], Orders: one("each-current"),
					Keys: []inventory.IdempotencyRecord{{Key: "each-key", SKU: "each-current", RequestHash: []byte{1}}}},
				{SKU: "each-none", Epoch: 1, Orders: one("each-none")},
				{SKU: "each-ahead", Epoch: epochs["each-ahead"] + 1, Orders: one("each-ahead")},
			}
			batches[1].Keys[0].OrderID = batches[1].Orders[0].ID
			for delivery, want := range []int{1, 0} {
				out, err := db.PersistReservedEach(ctx, batches)
				if err != nil || len(out) != 4 {
					t.Fatalf("delivery %d: %+v %v", delivery+1, out, err)
				}
				if out[1].Err != nil || out[1].Written != want {
					t.Errorf("delivery %d, the current sale's batch: %+v, want %d written", delivery+1, out[1], want)
				}
				for i, wantErr := range map[int]error{0: inventory.ErrStaleSale, 2: inventory.ErrStaleSale, 3: inventory.ErrUnavailable} {
					if !errors.Is(out[i].Err, wantErr) || out[i].Written != 0 {
						t.Errorf("delivery %d, batch of %s: %+v, want %v", delivery+1, batches[i].SKU, out[i], wantErr)
					}
				}
			}
			for sku, wantOrders := range map[string]int64{"each-current": 1, "each-old": 0, "each-ahead": 0} {
				a, err := db.Audit(ctx, sku)
				if err != nil || !a.Consistent() || a.Orders != wantOrders || a.Available != 10-2*wantOrders {
					t.Errorf("%s: audit %+v %v, want %d orders", sku, a, err, wantOrders)
				}
			}
			if _, found, err := db.FindOrder(ctx, batches[2].Orders[0].ID); err != nil || found {
				t.Errorf("the order of a SKU without a sale was written (%v)", err)
			}
		})
	}
}

// TestWritersOfTheSameSKUsInOppositeOrderNeverDeadlock: two consumers'
// transactions carry the same SKUs, one in ascending order, the other in
// descending; the rows are locked in one order, so neither fails, and every
// order is counted once.
func TestWritersOfTheSameSKUsInOppositeOrderNeverDeadlock(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 8)
			const skus, rounds = 20, 30
			names := make([]string, skus)
			epochs := make([]int64, skus)
			for i := range names {
				names[i] = fmt.Sprintf("opposite-%02d", i)
				e, err := db.StartSaleWith(ctx, inventory.SaleStart{SKU: names[i], Available: 1000})
				if err != nil {
					t.Fatal(err)
				}
				epochs[i] = e
			}
			write := func(descending bool) error {
				for range rounds {
					batches := make([]reservation.SaleBatch, skus)
					for i := range batches {
						j := i
						if descending {
							j = skus - 1 - i
						}
						batches[i] = reservation.SaleBatch{SKU: names[j], Epoch: epochs[j], Orders: []inventory.Order{{
							ID: uuid.NewString(), SKU: names[j], Quantity: 1, UserID: "u", Strategy: strategies.NameRedisReserve, State: inventory.OrderFinal}}}
					}
					out, err := db.PersistReservedEach(ctx, batches)
					if err != nil {
						return err
					}
					for i, o := range out {
						if o.Err != nil || o.Written != 1 {
							return fmt.Errorf("batch of %s: %+v", batches[i].SKU, o)
						}
					}
				}
				return nil
			}
			bothWriters(t, func(writer int) error { return write(writer == 1) })
			for _, sku := range names {
				if a, err := db.Audit(ctx, sku); err != nil || !a.Consistent() || a.Orders != 2*rounds {
					t.Fatalf("%s: audit %+v %v, want %d orders", sku, a, err, 2*rounds)
				}
			}
		})
	}
}

// TestWritersOfSharedKeysInOppositeOrderNeverDeadlock: idempotency keys are
// one table across SKUs, and Redis keeps them per SKU, so two SKUs' orders
// may carry the same key. Two transactions of disjoint SKUs whose keys
// come in opposite orders insert them in one order (found by review: in
// batch order, each waited for the key the other had inserted).
func TestWritersOfSharedKeysInOppositeOrderNeverDeadlock(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.New(t, engine, 8)
			const keys, rounds = 200, 30
			skus := make([][]string, 2)
			epochs := map[string]int64{}
			for writer := range skus {
				for i := range keys {
					sku := fmt.Sprintf("sharedkeys-%d-%03d", writer, i)
					e, err := db.StartSaleWith(ctx, inventory.SaleStart{SKU: sku, Available: 10_000})
					if err != nil {
						t.Fatal(err)
					}
					skus[writer], epochs[sku] = append(skus[writer], sku), e
				}
			}
			write := func(writer int) error {
				for round := range rounds {
					var batches []reservation.SaleBatch
					for i, sku := range skus[writer] {
						k := i
						if writer == 1 {
							k = keys - 1 - i
						}
						o := inventory.Order{ID: uuid.NewString(), SKU: sku, Quantity: 1, UserID: "u", Strategy: strategies.NameRedisReserve, State: inventory.OrderFinal}
						batches = append(batches, reservation.SaleBatch{SKU: sku, Epoch: epochs[sku], Orders: []inventory.Order{o},
							Keys: []inventory.IdempotencyRecord{{Key: fmt.Sprintf("shared-%d-%03d", round, k), SKU: sku, RequestHash: []byte{1}, OrderID: o.ID}}})
					}
					if _, err := db.PersistReservedEach(ctx, batches); err != nil {
						return err
					}
				}
				return nil
			}
			bothWriters(t, write)
		})
	}
}

// bothWriters runs write for writers 0 and 1 at once and fails the test if
// either failed.
func bothWriters(t *testing.T, write func(writer int) error) {
	t.Helper()
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for writer := range 2 {
		wg.Go(func() { errs <- write(writer) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a writer failed: %v", err)
		}
	}
}
