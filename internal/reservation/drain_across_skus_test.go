package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

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
// several, each SKU's batch whole in one of them.
func TestATransactionTakesAtMostTwoThousandOrders(t *testing.T) {
	s := newSale(t, "postgres")
	skus := startCatalog(t, s, "wide", 5, 600)
	for _, sku := range skus {
		for j := range 600 {
			if _, err := s.order(sku, 1, fmt.Sprintf("u-%d", j), ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	sink := &countingSink{Sink: s.db}
	s.consume(sink)
	s.seen.waitFor(t, 3000)
	calls := sink.seen()
	for _, c := range calls {
		if c.orders > 2048 {
			t.Errorf("a transaction of %d orders, want at most 2048: %+v", c.orders, calls)
		}
		// The first round reads 512 of each stream, the second the 88
		// left: a transaction that split a SKU's batch would be neither.
		if c.orders%512 != 0 && c.orders%88 != 0 {
			t.Errorf("a transaction of %d orders split a SKU's batch: %+v", c.orders, calls)
		}
	}
	if len(calls) < 2 {
		t.Errorf("3,000 orders in %d transactions, want them split: %+v", len(calls), calls)
	}
	for _, sku := range skus {
		if a, err := s.db.Audit(context.Background(), sku); err != nil || !a.Consistent() || a.Available != 0 || a.Orders != 600 {
			t.Fatalf("%s: audit %+v %v, want 600 orders, sold out", sku, a, err)
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
			errs := make(chan error, 2)
			var wg sync.WaitGroup
			for _, descending := range []bool{false, true} {
				wg.Go(func() { errs <- write(descending) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("a writer failed: %v", err)
				}
			}
			for _, sku := range names {
				if a, err := db.Audit(ctx, sku); err != nil || !a.Consistent() || a.Orders != 2*rounds {
					t.Fatalf("%s: audit %+v %v, want %d orders", sku, a, err, 2*rounds)
				}
			}
		})
	}
}
