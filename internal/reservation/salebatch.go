package reservation

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/flashsale/stock/internal/inventory"
)

// SaleBatch is orders of one SKU taken in one sale (Epoch), as a Sink
// writes them.
type SaleBatch struct {
	SKU    string
	Epoch  int64
	Orders []inventory.Order
	Keys   []inventory.IdempotencyRecord
}

// SaleBatchOutcome is what became of one SaleBatch: Written orders, or Err.
type SaleBatchOutcome struct {
	Written int
	Err     error
}

// BatchSKUs returns the distinct SKUs of batches, sorted: the rows a Sink
// locks, in the order every writer takes them.
func BatchSKUs(batches []SaleBatch) []string {
	skus := make([]string, 0, len(batches))
	for _, b := range batches {
		skus = append(skus, b.SKU)
	}
	slices.Sort(skus)
	return slices.Compact(skus)
}

// JudgeSales compares each batch's sale with its SKU's current sale in the
// database (current, read under the rows' locks; a SKU missing has no
// sale): a batch of the current sale gets a nil Err, to be written; one
// of an older sale or of a SKU without one ErrStaleSale; one of a sale
// the database does not have yet ErrUnavailable.
func JudgeSales(batches []SaleBatch, current map[string]int64) []SaleBatchOutcome {
	out := make([]SaleBatchOutcome, len(batches))
	for i, b := range batches {
		cur, ok := current[b.SKU]
		switch {
		case !ok:
			out[i].Err = fmt.Errorf("%w: %q has no sale in the database", inventory.ErrStaleSale, b.SKU)
		case b.Epoch < cur:
			out[i].Err = fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d", inventory.ErrStaleSale, b.SKU, cur, b.Epoch)
		case b.Epoch > cur:
			out[i].Err = fmt.Errorf("%w: %q is in sale %d, the orders are of sale %d, not committed yet", inventory.ErrUnavailable, b.SKU, cur, b.Epoch)
		}
	}
	return out
}

// WriteJudged is the part of a Sink's PersistReservedEach common to the
// engines, once the transaction holds the batches' stock rows and has read
// their sales (current): it judges each batch (JudgeSales), writes the
// orders and keys of those of the current sale in one call of write, and
// counts what each of them wrote.
func WriteJudged(batches []SaleBatch, current map[string]int64,
	write func(orders []inventory.Order, keys []inventory.IdempotencyRecord) (map[string]int, error)) ([]SaleBatchOutcome, error) {
	var (
		orders  []inventory.Order
		keys    []inventory.IdempotencyRecord
		writing []int
	)
	outcomes := JudgeSales(batches, current)
	for i, b := range batches {
		if outcomes[i].Err == nil {
			orders, keys, writing = append(orders, b.Orders...), append(keys, b.Keys...), append(writing, i)
		}
	}
	if len(orders) == 0 {
		return outcomes, nil
	}
	written, err := write(orders, keys)
	if err != nil {
		return nil, err
	}
	CountWritten(batches, writing, outcomes, written)
	return outcomes, nil
}

// PersistOne is PersistReserved for a Sink: PersistReservedEach of one
// batch, its outcome as the error.
func PersistOne(ctx context.Context, sink Sink, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error) {
	out, err := sink.PersistReservedEach(ctx, []SaleBatch{{SKU: sku, Epoch: epoch, Orders: orders, Keys: keys}})
	if err != nil {
		return 0, err
	}
	return out[0].Written, out[0].Err
}

// CountWritten shares the orders written of each SKU (written) among the
// batches written (writing, indexes of batches in order): a SKU has one
// batch of its current sale.
func CountWritten(batches []SaleBatch, writing []int, outcomes []SaleBatchOutcome, written map[string]int) {
	for _, i := range writing {
		sku := batches[i].SKU
		n := min(written[sku], len(batches[i].Orders))
		outcomes[i].Written = n
		written[sku] -= n
	}
}

// KeysInOrder returns keys sorted by key, the first of each key kept: the
// order every writer inserts them in. The idempotency keys are one table
// across SKUs while Redis keeps them per SKU, so two transactions of
// disjoint SKUs may carry the same keys; inserted in batch order, each
// could wait for a key the other inserted first (a deadlock: found by
// review, TestWritersOfSharedKeysInOppositeOrderNeverDeadlock).
func KeysInOrder(keys []inventory.IdempotencyRecord) []inventory.IdempotencyRecord {
	out := slices.Clone(keys)
	slices.SortStableFunc(out, func(a, b inventory.IdempotencyRecord) int { return strings.Compare(a.Key, b.Key) })
	return slices.CompactFunc(out, func(a, b inventory.IdempotencyRecord) bool { return a.Key == b.Key })
}
