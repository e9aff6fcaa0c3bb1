// Package batched is the batched strategy (STRATEGY=batched): group
// commit. Each instance takes the concurrent
// orders of one SKU together, one transaction per batch. It owns its orders
// (inventory.Strategy's TakeOrder): it checks their idempotency keys, deducts and
// records them itself, through the Store it declares here, which the
// database adapters implement.
package batched

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// Name is the strategy's STRATEGY value.
const Name = "batched"

// errKeyTaken: a concurrent request committed one of the batch's keys
// first; the next attempt finds its record and replays it. It never leaves
// the package.
var errKeyTaken = errors.New("idempotency key taken concurrently")

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
	store    Store
	batches  *batcher
	attempts int
	log      *slog.Logger
	obs      Observer
}

// New returns the batched strategy over store.
func New(store Store, opts ...Option) *Batched {
	c := config{max: 256, attempts: 5, log: slog.Default(), obs: nopObserver{}, queue: nopQueueObserver{}}
	for _, o := range opts {
		o(&c)
	}
	b := &Batched{store: store, attempts: c.attempts, log: c.log, obs: c.obs}
	b.batches = newBatcher(c.max, c.wait, b.runBatch)
	b.batches.observe = c.queue
	return b
}

// Strategy implements inventory.Strategic: it takes whole orders, a batch
// of a SKU's at a time.
func (b *Batched) Strategy() inventory.Strategy {
	return inventory.Strategy{Name: Name, TakeOrder: b.TakeOrder}
}

// TakeOrder is the strategy's TakeOrder: it queues o for its SKU's next
// batch and returns its answer: the order (its own, or the one its
// idempotency key created before), or the error of package inventory that
// answers it.
func (b *Batched) TakeOrder(ctx context.Context, o inventory.PendingOrder) (inventory.Order, error) {
	return b.batches.submit(newBatchOrder(ctx, o.Order, o.IdempotencyKey, o.Fingerprint, o.PerUserLimit))
}

var _ inventory.Strategic = (*Batched)(nil)

// runBatch runs one batch's transaction under ctx (the earliest deadline of
// its orders), again after a conflict, and answers every order.
func (b *Batched) runBatch(ctx context.Context, batch []*batchOrder) []batchResult {
	began := time.Now()
	var (
		results   []batchResult
		createdID string
		decided   bool // the transaction function returned nil
		err       error
	)
	// A key taken concurrently is found by the next attempt, which
	// replays it: such a retry resolves a key, so it does not use up the
	// attempts, and there are at most as many as the batch has keys. The
	// attempts bound the other aborts (conflicts, and key-taken retries
	// beyond that), so one contested key does not make a whole batch busy.
	keyRetries := 0
	for _, o := range batch {
		if o.key != "" {
			keyRetries++
		}
	}
	aborted := 0
	for attempt := 0; ; attempt++ {
		results = make([]batchResult, len(batch))
		decided = false
		err = b.store.InBatchTx(ctx, func(ctx context.Context, tx Tx) error {
			var err error
			createdID, err = decideBatch(ctx, tx, batch, results)
			decided = err == nil
			return err
		})
		if !errors.Is(err, inventory.ErrConflict) && !errors.Is(err, errKeyTaken) {
			break
		}
		if errors.Is(err, errKeyTaken) && keyRetries > 0 {
			keyRetries--
		} else if aborted++; aborted >= b.attempts {
			err = fmt.Errorf("%w: batch transaction aborted %d times: %w", inventory.ErrBusy, b.attempts, err)
			break
		}
		if r, ok := b.obs.(retryObserver); ok {
			reason := "conflict"
			if errors.Is(err, errKeyTaken) {
				reason = "key_taken"
			}
			r.Retried(Name, reason)
		}
		if perr := pause(ctx, backoff.Exponential(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
			err = perr
			break
		}
	}
	switch {
	case errors.Is(err, inventory.ErrOutcomeUnknown) && decided && createdID == "":
		// The batch wrote nothing (it only replayed keys or refused sold
		// out): what it read was committed by others, so its answers
		// stand whether its own commit landed or not.
		b.log.Debug("commit answer of a batch that wrote nothing lost", "sku", batch[0].sku, "err", err)
		err = nil
	case errors.Is(err, inventory.ErrOutcomeUnknown):
		err = b.resolveUnknownCommit(ctx, batch[0].sku, createdID, err)
	}
	if err != nil {
		if !errors.Is(err, inventory.ErrUnknownSKU) {
			b.log.Warn("batch failed", "sku", batch[0].sku, "size", len(batch), "strategy", Name, "err", err)
		}
		for i := range results {
			results[i] = batchResult{err: err}
		}
	}
	b.obs.BatchDone(len(batch), time.Since(began), inventory.Outcome(err))
	return results
}

// resolveUnknownCommit asks the database whether a batch whose commit
// answer was lost committed, before its buyers are answered: one of its
// created orders' rows is the proof, since the batch is one transaction,
// and the lookup waits for the SKU's row (Tx.ResolveOrder), so its
// answer is final. Nil when it did; ErrUnavailable (nothing deducted) when
// it did not. The lookup has a budget of its own
// (inventory.UnknownCommitBudget), tried again while the database does not
// answer; only when it never does is the outcome left unknown.
func (b *Batched) resolveUnknownCommit(ctx context.Context, sku, createdID string, commitErr error) error {
	if createdID == "" {
		return commitErr
	}
	budget, cancel := context.WithTimeout(context.WithoutCancel(ctx), inventory.UnknownCommitBudget)
	defer cancel()
	for attempt := 0; ; attempt++ {
		try, cancelTry := context.WithTimeout(budget, 2*time.Second)
		found := false
		err := b.store.InBatchTx(try, func(ctx context.Context, tx Tx) (err error) {
			_, found, err = tx.ResolveOrder(ctx, sku, createdID)
			return err
		})
		cancelTry()
		switch {
		case err == nil && found:
			b.log.Warn("commit answer of a batch lost, but its orders exist", "order_id", createdID, "err", commitErr)
			return nil
		case err == nil:
			return inventory.NotLanded("the batch's orders were not taken, nothing was deducted", commitErr)
		}
		if pause(budget, backoff.Exponential(attempt, 20*time.Millisecond, 500*time.Millisecond)) != nil {
			return commitErr
		}
	}
}

// decideBatch is the batch's transaction: it reads the records of the
// batch's keys, decides every order in arrival order (planBatch), deducts
// the total of the accepted ones with one conditional UPDATE (or, when that
// cannot cover them all, decides again under the row lock with what is
// left), and inserts the accepted orders and their idempotency records. It
// fills results and returns the id of one created order, "" when it wrote
// nothing.
func decideBatch(ctx context.Context, tx Tx, batch []*batchOrder, results []batchResult) (string, error) {
	sku := batch[0].sku
	var keys []string
	for _, o := range batch {
		if o.key != "" && !slices.Contains(keys, o.key) {
			keys = append(keys, o.key)
		}
	}
	var known map[string]inventory.IdempotencyRecord
	if len(keys) > 0 {
		var err error
		if known, err = tx.FindIdempotencyKeys(ctx, keys); err != nil {
			return "", err
		}
	}

	// The buyers' units are claimed before the stock row is touched, as
	// every transaction of the lifecycle takes them (a cancel: order,
	// buyer, stock), and before the deduction, as if every order fit: the
	// stock row is the batch's serial section (every batch of the SKU
	// waits for it), and only what must should run under it. When the
	// stock then cannot cover the plan, the claims of the orders refused
	// are given back under the row lock, in one statement.
	limit, held, err := claimBuyers(ctx, tx, batch, known)
	if err != nil {
		return "", err
	}
	plan, total := planBatch(batch, known, math.MaxInt64, limit, held)
	claims := claimsOf(batch, plan, limit)
	var windowErr error
	if total > 0 {
		ok, err := tx.DeductIfAvailable(ctx, sku, total)
		if err != nil {
			return "", err
		}
		if !ok {
			level, err := tx.LockLevel(ctx, sku)
			if err != nil {
				return "", err
			}
			available := level.Available
			if windowErr = level.Refusal(0); windowErr != nil {
				// Not open: nothing fits, and the orders that would
				// have taken stock are told why.
				available = 0
			}
			plan, total = planBatch(batch, known, available, limit, held)
			if unclaimed := surplus(claims, claimsOf(batch, plan, limit)); len(unclaimed) > 0 {
				if err := tx.ReleaseUnitsOf(ctx, sku, unclaimed); err != nil {
					return "", err
				}
			}
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
	}

	var orders []inventory.Order
	var taken []int // the index in batch of each of orders
	var records []inventory.IdempotencyRecord
	priors := map[string]inventory.Order{} // by key
	for i, o := range batch {
		switch d := plan[i]; d.verdict {
		case accepted:
			order := o.order
			if limit > 0 {
				// Claimed on the buyer's count above; its cancel or
				// expiry gives back this much.
				order.Claimed = order.Quantity
			}
			orders, taken = append(orders, order), append(taken, i)
			results[i].order = order
			if o.key != "" {
				records = append(records, inventory.IdempotencyRecord{Key: o.key, SKU: sku, RequestHash: o.fingerprint, OrderID: o.order.ID})
			}
		case soldOut:
			results[i].err = inventory.ErrSoldOut
			if windowErr != nil {
				results[i].err = windowErr
			}
		case limitReached:
			results[i].err = fmt.Errorf("%w: %q may hold or have paid for at most %d units of %q in this sale",
				inventory.ErrLimitReached, o.order.UserID, limit, sku)
		case conflicting:
			results[i].err = fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, o.key)
		case follows:
			results[i] = results[d.of] // d.of < i: decided already
		case replays:
			prior, ok := priors[o.key]
			if !ok {
				var err error
				if prior, err = tx.GetOrder(ctx, known[o.key].OrderID); err != nil {
					return "", err
				}
				priors[o.key] = prior
			}
			results[i].order = prior
		}
	}
	if len(orders) == 0 {
		return "", nil
	}
	expiries, err := tx.InsertOrders(ctx, orders)
	if err != nil {
		return "", err
	}
	for j, i := range taken {
		results[i].order.ExpiresAt = expiries[j]
	}
	for i := range batch {
		if plan[i].verdict == follows {
			// Set above before the expiries were known.
			results[i] = results[plan[i].of]
		}
	}
	if len(records) > 0 {
		// In key order, so two batches that share keys never wait for
		// each other's in opposite orders.
		slices.SortFunc(records, func(a, b inventory.IdempotencyRecord) int { return strings.Compare(a.Key, b.Key) })
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

// claimsOf sums the units of the accepted orders of plan per buyer, when
// the batch has a per-user limit; nil otherwise.
func claimsOf(batch []*batchOrder, plan []decision, limit int64) map[string]int64 {
	if limit <= 0 {
		return nil
	}
	claims := map[string]int64{}
	for i, o := range batch {
		if plan[i].verdict == accepted {
			claims[o.order.UserID] += o.quantity
		}
	}
	return claims
}

// surplus is what each buyer claimed beyond what it keeps: the units to
// give back once the batch's plan shrank.
func surplus(claimed, kept map[string]int64) map[string]int64 {
	var out map[string]int64
	for u, q := range claimed {
		if d := q - kept[u]; d > 0 {
			if out == nil {
				out = map[string]int64{}
			}
			out[u] = d
		}
	}
	return out
}

// claimBuyers claims the units the batch's buyers would take if every
// order fit, when the batch has a per-user limit (limit 0 and nothing done
// otherwise), and returns what each buyer held before (absent: none).
//
// A flash sale's buyers are mostly new to the SKU: their rows are created
// with their claims in one statement (ClaimFirstUnits), and a batch of new
// buyers does nothing more. When some buyers had a row, those rows are
// read and locked (LockBuyers) and the batch is planned again from what
// they hold; every buyer's claim is then set to what that plan gives it:
// the buyers with a row grow, and a new buyer's claim, which only an
// idempotency key shared with another buyer's order ties to the others'
// plans, grows or shrinks with it (pinned by
// TestBatchedBuyerWhoseOrderLosesItsKeyKeepsNoUnits,
// TestBatchedNewBuyerWhoseClaimGrowsIsDecided).
func claimBuyers(ctx context.Context, tx Tx, batch []*batchOrder, known map[string]inventory.IdempotencyRecord) (int64, map[string]int64, error) {
	limit := batch[0].limit
	if limit <= 0 {
		return 0, nil, nil
	}
	sku := batch[0].sku
	plan, _ := planBatch(batch, known, math.MaxInt64, limit, nil)
	claims := claimsOf(batch, plan, limit)
	if len(claims) == 0 {
		return limit, nil, nil
	}
	created, err := tx.ClaimFirstUnits(ctx, sku, claims)
	if err != nil {
		return 0, nil, err
	}
	var existing []string
	for u := range claims {
		if !slices.Contains(created, u) {
			existing = append(existing, u)
		}
	}
	if len(existing) == 0 {
		return limit, nil, nil
	}
	slices.Sort(existing)
	held, err := tx.LockBuyers(ctx, sku, existing)
	if err != nil {
		return 0, nil, err
	}
	plan, _ = planBatch(batch, known, math.MaxInt64, limit, held)
	// What each buyer's row counts now, and what this transaction has
	// claimed on it so far.
	rows, claimed := maps.Clone(held), map[string]int64{}
	for _, u := range created {
		rows[u], claimed[u] = claims[u], claims[u]
	}
	want := claimsOf(batch, plan, limit)
	grow, shrink := map[string]int64{}, surplus(claimed, want)
	for u, q := range want {
		if d := q - claimed[u]; d > 0 {
			grow[u] = d
		}
	}
	if len(grow) > 0 {
		ok, err := tx.ClaimUnitsOf(ctx, sku, grow, rows, limit)
		if err != nil {
			return 0, nil, err
		}
		if !ok {
			// A row read and locked above refused a claim planned from
			// it: only a row deleted since (a new sale) does that.
			return 0, nil, fmt.Errorf("%w: a buyer's units changed under the batch", inventory.ErrConflict)
		}
	}
	if len(shrink) > 0 {
		if err := tx.ReleaseUnitsOf(ctx, sku, shrink); err != nil {
			return 0, nil, err
		}
	}
	return limit, held, nil
}

// verdict is what a batch decides for one of its orders.
type verdict int

const (
	// accepted: the order is created and its key, if any, recorded.
	accepted verdict = iota
	// soldOut: it does not fit in what the orders before it left.
	soldOut
	// replays: the database has its key, recorded for the same request.
	replays
	// conflicting: its key is recorded (in the database, or by an order
	// accepted earlier in the batch) for another request.
	conflicting
	// follows: an order accepted earlier in the batch has its key and the
	// same request; it gets that order's answer.
	follows
	// limitReached: it would take its buyer past the per-user limit, with
	// what the buyer held before the batch and what the batch accepted for
	// them before it.
	limitReached
)

// decision is a verdict, with the order followed for follows.
type decision struct {
	verdict verdict
	of      int
}

// planBatch decides the orders of a batch in arrival order, as if each
// were served alone after the ones before it, given the keys' records in
// the database (known) and the units available: a key the database has
// replays the same request and refuses another; a key not there belongs to
// the first order of the batch that is accepted with it, which a later
// order with the same request follows and one with another request
// conflicts with; an order whose key was taken by no accepted order (an
// earlier one with it may have been sold out) is a fresh request, accepted
// while it fits in what the accepted ones before it left. It returns the
// decisions and the total of the accepted orders.
func planBatch(batch []*batchOrder, known map[string]inventory.IdempotencyRecord, available, limit int64, held map[string]int64) ([]decision, int64) {
	plan := make([]decision, len(batch))
	claimed := map[string]int{} // key -> the accepted order that holds it
	fit := fitter{available: available}
	taken := map[string]int64{} // buyer -> units held before and accepted since
	for i, o := range batch {
		if o.key != "" {
			if rec, ok := known[o.key]; ok {
				plan[i].verdict = conflicting
				if bytes.Equal(rec.RequestHash, o.fingerprint) {
					plan[i].verdict = replays
				}
				continue
			}
			if j, ok := claimed[o.key]; ok {
				plan[i] = decision{verdict: conflicting}
				if bytes.Equal(batch[j].fingerprint, o.fingerprint) {
					plan[i] = decision{verdict: follows, of: j}
				}
				continue
			}
		}
		user := o.order.UserID
		if limit > 0 {
			if _, ok := taken[user]; !ok {
				taken[user] = held[user]
			}
			if taken[user]+o.quantity > limit {
				plan[i].verdict = limitReached
				continue
			}
		}
		if !fit.take(o.quantity) {
			plan[i].verdict = soldOut
			continue
		}
		if limit > 0 {
			taken[user] += o.quantity
		}
		plan[i].verdict = accepted
		if o.key != "" {
			claimed[o.key] = i
		}
	}
	return plan, fit.total
}

// fitter accepts quantities in arrival order while each fits in what is
// left of available: an order that does not fit is refused whole, and
// later, smaller ones may still fit. Taking them in arrival order is what
// makes the answers linearizable: each order sees the stock the ones
// before it left.
type fitter struct {
	available, total int64
}

func (f *fitter) take(q int64) bool {
	if q > f.available-f.total {
		return false
	}
	f.total += q
	return true
}

// pause waits d, or less if ctx ends first; then it reports
// inventory.ErrBusy with the context's cause.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if err := backoff.Wait(ctx, d); err != nil {
		return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
	}
	return nil
}
