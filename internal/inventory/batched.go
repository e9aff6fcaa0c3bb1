package inventory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// NameBatched is the batched strategy's STRATEGY value.
const NameBatched = "batched"

// BatchObserver hears about the batches of the batched strategy, for
// metrics. It is called on an order's goroutine: cheap and safe for
// concurrent use.
type BatchObserver interface {
	// BatchDone reports a batch's size, how long its transaction took
	// (retries included) and its outcome (see Outcome).
	BatchDone(size int, elapsed time.Duration, outcome string)
}

// QueueObserver hears of the orders that wait in the process for another
// order's goroutine: the batch's leader runs the transaction of every order
// in the batch. A scheduler that lets one order move at a time
// (internal/explore) needs to know that such an order is not stuck but
// waiting for another; production passes none.
type QueueObserver interface {
	// Joining is called on the order's goroutine before it joins its
	// SKU's queue. It may block: a scheduler holds the order there until
	// its turn.
	Joining(ctx context.Context)
	// Waiting is called on the order's goroutine before it waits for its
	// answer or its turn to lead.
	Waiting(ctx context.Context)
	// Woken is called, with the waiting order's context, by the goroutine
	// that is about to hand it its answer or its turn to lead.
	Woken(ctx context.Context)
}

type nopQueueObserver struct{}

func (nopQueueObserver) Joining(context.Context) {}
func (nopQueueObserver) Waiting(context.Context) {}
func (nopQueueObserver) Woken(context.Context)   {}

// retryObserver is the part of Observer a BatchObserver may also have:
// the batch's retries are then counted with the other strategies'.
type retryObserver interface {
	Retried(strategy, reason string)
}

type nopBatchObserver struct{}

func (nopBatchObserver) BatchDone(int, time.Duration, string) {}

// Batched takes the concurrent orders of one SKU in this process together:
// while one transaction for the SKU is in flight, new orders queue; when it
// ends, the queue becomes the next batch (group commit). One transaction
// per batch deducts the batch's total with one conditional UPDATE and
// inserts its orders and idempotency records with multi-row INSERTs. When
// the stock cannot cover the whole batch, it locks the row, reads what is
// left and accepts the orders in arrival order while each fits (never a
// partial order); the rest are sold out. The invariant: the batch's total
// is deducted by one conditional UPDATE (or under the row lock, in arrival
// order while each order fits), so no schedule can take more than is there,
// whatever other strategies or instances write the same SKU.
type Batched struct {
	store    BatchStore
	batches  *batcher
	attempts int
	log      *slog.Logger
	obs      BatchObserver
}

type batchedConfig struct {
	max      int
	wait     time.Duration
	attempts int
	log      *slog.Logger
	obs      BatchObserver
	queue    QueueObserver
}

// BatchOption configures Batched.
type BatchOption func(*batchedConfig)

// WithBatchMax bounds the orders of one batch. Default 256.
func WithBatchMax(n int) BatchOption {
	return func(c *batchedConfig) { c.max = max(1, n) }
}

// WithBatchWait makes the leader of a batch wait up to d for more orders
// (less if the batch fills or the leader's deadline passes) before it
// takes the queue. Default 0: no wait; the batch is what queued while the
// previous transaction of the SKU ran.
func WithBatchWait(d time.Duration) BatchOption {
	return func(c *batchedConfig) { c.wait = max(0, d) }
}

// WithBatchTxAttempts bounds how often a batch's transaction runs again
// after a conflict (deadlock, serialisation failure) or a concurrent commit
// of one of its idempotency keys. Default 5; then its orders are busy.
func WithBatchTxAttempts(n int) BatchOption {
	return func(c *batchedConfig) { c.attempts = max(1, n) }
}

// WithBatchLogger sets the logger of failed batches. Default slog.Default().
func WithBatchLogger(l *slog.Logger) BatchOption {
	return func(c *batchedConfig) { c.log = l }
}

// WithBatchObserver sets who hears about batches. Default: nobody.
func WithBatchObserver(o BatchObserver) BatchOption {
	return func(c *batchedConfig) { c.obs = o }
}

// WithQueueObserver sets who hears of orders waiting for their batch.
// Default: nobody.
func WithQueueObserver(o QueueObserver) BatchOption {
	return func(c *batchedConfig) { c.queue = o }
}

// NewBatched returns the batched strategy over store.
func NewBatched(store BatchStore, opts ...BatchOption) *Batched {
	c := batchedConfig{max: 256, attempts: 5, log: slog.Default(), obs: nopBatchObserver{}, queue: nopQueueObserver{}}
	for _, o := range opts {
		o(&c)
	}
	b := &Batched{store: store, attempts: c.attempts, log: c.log, obs: c.obs}
	b.batches = newBatcher(c.max, c.wait, b.runBatch)
	b.batches.observe = c.queue
	return b
}

// Name implements Strategy.
func (*Batched) Name() string { return NameBatched }

// Deduct implements Strategy for a caller that runs the order's transaction
// itself (a Service hands Batched whole orders instead, see takeOrder):
// with no batch to join, it deducts as Conditional does.
func (*Batched) Deduct(ctx context.Context, sku string, quantity int64, inTx TxRunner) error {
	return NewConditional().Deduct(ctx, sku, quantity, inTx)
}

// takeOrder queues o for its SKU's next batch and returns its answer: the
// order (its own, or the one its idempotency key created before), or the
// error of this package that answers it.
func (b *Batched) takeOrder(o *batchOrder) (Order, error) {
	return b.batches.submit(o)
}

// orderTaker is implemented by strategies that own the transaction of their
// orders: the Service hands them the whole order, idempotency key included,
// instead of a TxRunner.
type orderTaker interface {
	takeOrder(o *batchOrder) (Order, error)
}

var _ orderTaker = (*Batched)(nil)

// runBatch runs one batch's transaction under ctx (the earliest deadline of
// its orders), again after a conflict, and answers every order.
func (b *Batched) runBatch(ctx context.Context, batch []*batchOrder) []batchResult {
	began := time.Now()
	follows := dedupeKeys(batch)
	var (
		results   []batchResult
		createdID string
		err       error
	)
	for attempt := 0; ; attempt++ {
		results = make([]batchResult, len(batch))
		err = b.store.InBatchTx(ctx, func(ctx context.Context, tx BatchTx) error {
			var err error
			createdID, err = decideBatch(ctx, tx, batch, follows, results)
			return err
		})
		if !errors.Is(err, ErrConflict) && !errors.Is(err, errKeyTaken) {
			break
		}
		if attempt+1 >= b.attempts {
			err = fmt.Errorf("%w: batch transaction aborted %d times: %w", ErrBusy, b.attempts, err)
			break
		}
		if r, ok := b.obs.(retryObserver); ok {
			reason := "conflict"
			if errors.Is(err, errKeyTaken) {
				reason = "key_taken"
			}
			r.Retried(NameBatched, reason)
		}
		if perr := pause(ctx, jitter(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
			err = perr
			break
		}
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		err = b.resolveUnknownCommit(ctx, createdID, err)
	}
	if err != nil {
		if !errors.Is(err, ErrUnknownSKU) {
			b.log.Warn("batch failed", "sku", batch[0].sku, "size", len(batch), "strategy", NameBatched, "err", err)
		}
		for i := range results {
			results[i] = batchResult{err: err}
		}
	}
	for i, j := range follows {
		switch {
		case j == conflictingKey:
			results[i] = batchResult{err: fmt.Errorf("%w: key %q", ErrIdempotencyConflict, batch[i].key)}
		case j >= 0:
			results[i] = results[j]
		}
	}
	b.obs.BatchDone(len(batch), time.Since(began), Outcome(err))
	return results
}

// resolveUnknownCommit asks the database whether a batch whose commit
// answer was lost committed: one of its created orders' rows is the proof,
// since the batch is one transaction. Nil when it did.
func (b *Batched) resolveUnknownCommit(ctx context.Context, createdID string, commitErr error) error {
	if createdID == "" {
		return commitErr
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if _, found, err := b.store.FindOrder(ctx, createdID); err == nil && found {
		b.log.Warn("commit answer of a batch lost, but its orders exist", "order_id", createdID, "err", commitErr)
		return nil
	}
	return commitErr
}

// decideBatch is the batch's transaction: it replays the keys the database
// knows, deducts the total of the rest with one conditional UPDATE (or,
// when that cannot cover them all, under the row lock in arrival order
// while each fits), and inserts the accepted orders and their idempotency
// records. It fills results (followers of a key excepted) and returns the
// id of one created order, "" when none.
func decideBatch(ctx context.Context, tx BatchTx, batch []*batchOrder, follows []int, results []batchResult) (string, error) {
	sku := batch[0].sku
	var keys []string
	for i, o := range batch {
		if follows[i] == leadsKey && o.key != "" {
			keys = append(keys, o.key)
		}
	}
	var known map[string]IdempotencyRecord
	if len(keys) > 0 {
		var err error
		if known, err = tx.FindIdempotencyKeys(ctx, keys); err != nil {
			return "", err
		}
	}
	var want []int
	var quantities []int64
	for i, o := range batch {
		if follows[i] != leadsKey {
			continue
		}
		if rec, ok := known[o.key]; ok && o.key != "" {
			if !bytes.Equal(rec.RequestHash, o.fingerprint) {
				results[i].err = fmt.Errorf("%w: key %q", ErrIdempotencyConflict, o.key)
				continue
			}
			prior, err := tx.GetOrder(ctx, rec.OrderID)
			if err != nil {
				return "", err
			}
			results[i].order = prior
			continue
		}
		want = append(want, i)
		quantities = append(quantities, o.quantity)
	}
	if len(want) == 0 {
		return "", nil
	}

	accepted, total := fitInArrivalOrder(quantities, 1<<62)
	ok, err := tx.DeductIfAvailable(ctx, sku, total)
	if err != nil {
		return "", err
	}
	if !ok {
		level, err := tx.LockLevel(ctx, sku)
		if err != nil {
			return "", err
		}
		accepted, total = fitInArrivalOrder(quantities, level.Available)
		if total > 0 {
			ok, err := tx.DeductIfAvailable(ctx, sku, total)
			if err != nil {
				return "", err
			}
			if !ok {
				return "", fmt.Errorf("batched: %d units of %q under the row lock, yet the deduction of %d was refused", level.Available, sku, total)
			}
		}
	}

	var orders []Order
	var records []IdempotencyRecord
	for j, i := range want {
		o := batch[i]
		if !accepted[j] {
			results[i].err = ErrSoldOut
			continue
		}
		orders = append(orders, o.order)
		results[i].order = o.order
		if o.key != "" {
			records = append(records, IdempotencyRecord{Key: o.key, SKU: sku, RequestHash: o.fingerprint, OrderID: o.order.ID})
		}
	}
	if len(orders) == 0 {
		return "", nil
	}
	if err := tx.InsertOrders(ctx, orders); err != nil {
		return "", err
	}
	if len(records) > 0 {
		// In key order, so two batches that share keys never wait for
		// each other's in opposite orders.
		slices.SortFunc(records, func(a, b IdempotencyRecord) int { return strings.Compare(a.Key, b.Key) })
		n, err := tx.InsertIdempotencyRecords(ctx, records)
		if err != nil {
			return "", err
		}
		if n < len(records) {
			return "", fmt.Errorf("%w: %d of %d keys of the batch", errKeyTaken, len(records)-n, len(records))
		}
	}
	return orders[0].ID, nil
}

// Marks of dedupeKeys: an order that leads its key (or has none), and one
// whose key an earlier order of the batch used for another request.
const (
	leadsKey       = -1
	conflictingKey = -2
)

// dedupeKeys finds the orders of a batch that share an idempotency key with
// an earlier one: follows[i] is the index of that earlier order when the
// requests are the same (i gets its answer), conflictingKey when they
// differ (i is an idempotency conflict), and leadsKey otherwise.
func dedupeKeys(batch []*batchOrder) []int {
	follows := make([]int, len(batch))
	first := map[string]int{}
	for i, o := range batch {
		follows[i] = leadsKey
		if o.key == "" {
			continue
		}
		j, seen := first[o.key]
		switch {
		case !seen:
			first[o.key] = i
		case bytes.Equal(batch[j].fingerprint, o.fingerprint):
			follows[i] = j
		default:
			follows[i] = conflictingKey
		}
	}
	return follows
}

// fitInArrivalOrder accepts the quantities in order while each fits in what
// is left of available (an order that does not fit is refused whole, and
// later, smaller ones may still fit), and returns which it accepted and
// their total. Taking them in arrival order is what makes the answers
// linearizable: each order sees the stock the ones before it left.
func fitInArrivalOrder(quantities []int64, available int64) (accepted []bool, total int64) {
	accepted = make([]bool, len(quantities))
	for i, q := range quantities {
		if total+q <= available {
			accepted[i] = true
			total += q
		}
	}
	return accepted, total
}
