// Package batched is the batched strategy (STRATEGY=batched): group
// commit. Each instance takes its concurrent orders together, one
// transaction per batch whatever their SKUs (a lane; one by default), so
// a catalog's orders are batched as a hot SKU's are; a SKU whose row
// another transaction holds leaves the lane for a queue of its own. It owns
// its orders (inventory.Strategy's TakeOrder): it checks their idempotency
// keys, deducts and records them itself, through the Store it declares
// here, which the database adapters implement.
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
	"strconv"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// Name is the strategy's STRATEGY value.
const Name = "batched"

// DefaultHeldBatches is how many batches of held SKUs' queues run at once
// (WithHeldBatches).
const DefaultHeldBatches = 4

// DefaultLanes is the lanes the orders of every SKU share (WithLanes):
// one, the biggest batches. A lane skips held rows, so more lanes no
// longer buy isolation; they only run more, smaller transactions.
const DefaultLanes = 1

// lanes names n lanes and puts each SKU in one, by its FNV-1a hash.
func lanes(n int) func(sku string) string {
	names := make([]string, n)
	for i := range names {
		names[i] = "lane-" + strconv.Itoa(i)
	}
	return func(sku string) string {
		return names[inventory.Shard(sku, n)]
	}
}

// errKeyTaken: a concurrent request committed one of the batch's keys
// first; the next attempt finds its record and replays it. It never leaves
// the package.
var errKeyTaken = errors.New("idempotency key taken concurrently")

// Batched takes the concurrent orders of a lane in this process together:
// while one transaction for the lane is in flight, new orders queue; when
// it ends, the queue becomes the next batch (group commit). A SKU is in
// one lane (WithLanes), so its orders queue in arrival order. One
// statement of the batch locks its SKUs' rows in SKU order, skipping the
// rows other transactions hold, and deducts each SKU's total where it
// fits; multi-row INSERTs record the batch's orders and idempotency
// records. When a SKU's stock cannot cover its orders, the batch plans
// them again from the row that statement read under its lock, accepting
// them in arrival order while each fits (never a partial order); the rest
// are sold out. A held row's orders, and that SKU's later ones, move to a
// queue of that SKU alone, whose batches wait for the row, until it is
// empty. The invariant: each SKU's total is deducted by one conditional
// UPDATE, or planned from its row read under this transaction's lock, so
// no schedule can take more than is there, whatever other strategies or
// instances write the same SKU; and the rows are taken in SKU order, so
// batches never wait for each other in a circle.
type Batched struct {
	store    Store
	batches  *batcher
	attempts int
	log      *slog.Logger
	obs      Observer
}

// New returns the batched strategy over store.
func New(store Store, opts ...Option) *Batched {
	c := config{lanes: DefaultLanes, heldBatches: DefaultHeldBatches, max: 256, attempts: 5, log: slog.Default(), obs: nopObserver{}, queue: nopQueueObserver{}}
	for _, o := range opts {
		o(&c)
	}
	b := &Batched{store: store, attempts: c.attempts, log: c.log, obs: c.obs}
	waiting := func(ctx context.Context, batch []*batchOrder) []batchResult { return b.runBatch(ctx, batch, false) }
	b.batches = newBatcher(c.max, c.wait, waiting)
	b.batches.observe = c.queue
	if c.lanes > 0 {
		b.batches.laneOf = lanes(c.lanes)
		b.batches.run = func(ctx context.Context, batch []*batchOrder) []batchResult { return b.runBatch(ctx, batch, true) }
		b.batches.runHeld = heldSlots(c.heldBatches, waiting)
	}
	return b
}

// heldSlots runs at most n batches of held SKUs' queues at once, each
// waiting for its row on a connection of the pool, so that many rows held
// at once (a catalog's sale start locks every row it restarts) never take
// the pool from the lanes (found by review: 40 held SKUs, 40 connections
// waiting). A batch whose deadline passes while it waits for a slot is
// busy, as if it had waited for its row.
func heldSlots(n int, run batchRunner) batchRunner {
	slots := make(chan struct{}, max(1, n))
	return func(ctx context.Context, batch []*batchOrder) []batchResult {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			results := make([]batchResult, len(batch))
			for i := range results {
				results[i].err = fmt.Errorf("%w: waited for a turn to wait for a held row: %w", inventory.ErrBusy, context.Cause(ctx))
			}
			return results
		}
		defer func() { <-slots }()
		return run(ctx, batch)
	}
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

// runBatch answers every order of a batch, whatever their SKUs: one
// transaction for the batch (runTx), or more when it must be split: the
// orders of a SKU that has no stock row leave it (answered
// ErrUnknownSKU), and an order whose key an earlier order of another SKU
// holds is decided in a transaction after it (sharedKeyLater).
//
// A lane's batch (skipHeld) takes only the stock rows no other
// transaction holds, and answers errRowHeld for the orders of the others,
// and for every later order of their SKUs in the batch, so that the
// batcher moves them, in arrival order, to their SKU's queue.
func (b *Batched) runBatch(ctx context.Context, batch []*batchOrder, skipHeld bool) []batchResult {
	results := make([]batchResult, len(batch))
	rest := make([]int, len(batch))
	for i := range rest {
		rest[i] = i
	}
	heldSKUs := map[string]bool{}
	for len(rest) > 0 {
		var now []int
		now, rest = sharedKeyLater(batch, rest)
		for len(now) > 0 {
			if len(heldSKUs) > 0 {
				kept := now[:0:0]
				for _, i := range now {
					if heldSKUs[batch[i].sku] {
						results[i] = batchResult{err: errRowHeld}
						continue
					}
					kept = append(kept, i)
				}
				if now = kept; len(now) == 0 {
					break
				}
			}
			sub := make([]*batchOrder, len(now))
			for j, i := range now {
				sub[j] = batch[i]
			}
			subResults, unknown := b.runTx(ctx, sub, skipHeld)
			if unknown == nil {
				for j, i := range now {
					results[i] = subResults[j]
					if errors.Is(subResults[j].err, errRowHeld) {
						heldSKUs[batch[i].sku] = true
					}
				}
				break
			}
			// Nothing was written: those SKUs' orders are answered, the
			// others run again.
			kept := now[:0:0]
			for _, i := range now {
				if slices.Contains(unknown.skus, batch[i].sku) {
					results[i] = batchResult{err: fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, batch[i].sku)}
					continue
				}
				kept = append(kept, i)
			}
			now = kept
		}
	}
	return results
}

// runTx runs one transaction for batch under ctx (the earliest deadline of
// its orders), again after a conflict, and returns every order's answer;
// or, with no answers, the SKU of the batch that has no stock row.
func (b *Batched) runTx(ctx context.Context, batch []*batchOrder, skipHeld bool) ([]batchResult, *unknownSKU) {
	began := time.Now()
	var (
		results []batchResult
		created inventory.Order
		decided bool // the transaction function returned nil
		err     error
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
			created, err = decideBatch(ctx, tx, batch, results, skipHeld)
			decided = err == nil
			return err
		})
		if unknown := (unknownSKU{}); errors.As(err, &unknown) {
			if len(partsOf(batch)) > 1 {
				return nil, &unknown
			}
			err = unknown.err
		}
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
	case errors.Is(err, inventory.ErrOutcomeUnknown) && decided && created.ID == "":
		// The batch wrote nothing (it only replayed keys or refused sold
		// out): what it read was committed by others, so its answers
		// stand whether its own commit landed or not.
		b.log.Debug("commit answer of a batch that wrote nothing lost", "sku", batch[0].sku, "err", err)
		err = nil
	case errors.Is(err, inventory.ErrOutcomeUnknown):
		err = b.resolveUnknownCommit(ctx, created.SKU, created.ID, err)
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
	return results, nil
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
