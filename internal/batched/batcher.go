package batched

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/flashsale/stock/internal/inventory"
)

// batchOrder is one order waiting in a SKU's queue, as the batch former
// sees it. done receives its answer, lead the turn to take the next batch;
// both are buffered, so the sender never waits.
type batchOrder struct {
	ctx         context.Context
	sku         string
	quantity    int64
	key         string
	fingerprint []byte
	order       inventory.Order
	// limit is the buyer's per-user limit (0: none): the same for every
	// order of one Service, so one batch shares it.
	limit int64
	done  chan batchResult
	// lead hands o the queue whose next batch it is to take.
	lead chan *skuQueue
	// queue is the queue o is in, under batcher.mu: its lane's, or its
	// SKU's once its row was found held (see batcher).
	queue *skuQueue
	// answered: done has its answer. Only the goroutine that answers o
	// (its batch's leader) reads and writes it.
	answered bool
}

// batchResult is one order's answer from its batch.
type batchResult struct {
	order inventory.Order
	err   error
}

func newBatchOrder(ctx context.Context, order inventory.Order, key string, fingerprint []byte, limit int64) *batchOrder {
	return &batchOrder{
		ctx: ctx, sku: order.SKU, quantity: order.Quantity, key: key, fingerprint: fingerprint, order: order, limit: limit,
		done: make(chan batchResult, 1), lead: make(chan *skuQueue, 1),
	}
}

// batchRunner runs one batch under ctx and returns one answer per order, in
// the batch's order. A lane's runner answers errRowHeld for an order whose
// SKU's row another transaction holds: the batcher moves it to its SKU's
// queue instead of answering it.
type batchRunner func(ctx context.Context, batch []*batchOrder) []batchResult

// errRowHeld is a lane batch's answer for an order whose SKU's row
// another transaction held: nothing was decided for it. It never leaves
// the package.
var errRowHeld = errors.New("the SKU's row is held by another transaction")

// batcher forms batches of the orders of a queue (group commit): a SKU's,
// or a lane's that many SKUs share. The first order on an idle queue
// leads: it takes the queue (at most max orders) as a batch and runs it on
// its own goroutine, while orders that arrive meanwhile queue. When the
// batch is done, the leader answers every order of it and hands the lead
// to the oldest queued order, whose goroutine takes the next batch. No
// goroutine is started: every batch runs on the goroutine of one of its
// orders' callers, so its owner is that caller and nothing outlives the
// orders.
//
// A lane's batch does not wait for a row another transaction holds (a
// sale start deleting a large sale's orders, another instance's batch, a
// paused client): it decides the other SKUs and answers errRowHeld for
// that SKU's orders, which the batcher moves to a queue of that SKU
// alone (held), whose batches wait for the row (runHeld). The SKU's orders
// still queued in the lane move with them, and its later orders join that
// queue until it is empty, so a SKU's orders are decided in arrival order
// wherever they queue, and a held row holds up only its own SKU.
type batcher struct {
	max  int
	wait time.Duration
	run  batchRunner
	// runHeld runs the batches of a SKU whose row was held (see batcher).
	runHeld batchRunner

	// laneOf names the queue an order of a SKU joins: the SKU itself
	// (one batch a SKU, newBatcher's default), or one of a few lanes that
	// share their SKUs' batches (WithLanes).
	laneOf func(sku string) string

	mu     sync.Mutex
	queues map[string]*skuQueue
	// held is the queue of each SKU whose row a lane batch found held,
	// while an order of it is queued or in flight.
	held map[string]*skuQueue

	// queued, when set (tests), hears each order once it is in its queue.
	queued func(o *batchOrder)
	// observe hears of orders joining, waiting and being woken.
	observe QueueObserver
}

// skuQueue is one queue's state (a SKU's, or a lane's), under batcher.mu.
// It exists while an order of it is queued or in flight.
type skuQueue struct {
	lane string
	// held: the queue of one SKU whose row was held (batcher.held), not
	// one of queues.
	held    bool
	pending []*batchOrder
	// led: a leader exists (taking, running, or told to take the next batch).
	led bool
	// next is the order told to lead, until it takes its batch.
	next *batchOrder
	// full is closed when pending reaches max while a leader waits for
	// more orders (BATCH_WAIT).
	full chan struct{}
}

func newBatcher(maxSize int, wait time.Duration, run batchRunner) *batcher {
	return &batcher{max: max(1, maxSize), wait: max(0, wait), run: run, runHeld: run,
		queues: map[string]*skuQueue{}, held: map[string]*skuQueue{}, observe: nopQueueObserver{},
		laneOf: func(sku string) string { return sku }}
}

// submit queues o and returns its answer. It waits on o.done (the answer)
// and o.lead (the turn to take and run the next batch on this goroutine).
// An order whose deadline passes while queued is taken out of the queue and
// answers inventory.ErrBusy; one already in a batch waits for the batch,
// which runs under the earliest deadline of its orders, so no longer than
// its own.
func (b *batcher) submit(o *batchOrder) (inventory.Order, error) {
	b.observe.Joining(o.ctx)
	b.mu.Lock()
	q := b.held[o.sku]
	if q == nil {
		lane := b.laneOf(o.sku)
		if q = b.queues[lane]; q == nil {
			q = &skuQueue{lane: lane}
			b.queues[lane] = q
		}
	}
	leads := b.joinLocked(q, o)
	b.mu.Unlock()
	if b.queued != nil {
		b.queued(o)
	}
	if leads {
		b.lead(q, o)
	}

	expired := o.ctx.Done()
	for {
		b.observe.Waiting(o.ctx)
		select {
		case r := <-o.done:
			return r.order, r.err
		case q := <-o.lead:
			b.lead(q, o)
		case <-expired:
			b.observe.Woken(o.ctx) // by its own deadline
			if b.withdraw(o) {
				return inventory.Order{}, busyQueued(o.ctx)
			}
			// In a batch, or told to lead: the answer comes on done, or
			// the lead, which gives up at once (see lead).
			expired = nil
		}
	}
}

func busyQueued(ctx context.Context) error {
	return fmt.Errorf("%w: deadline passed while queued for a batch: %w", inventory.ErrBusy, context.Cause(ctx))
}

// joinLocked puts o at the end of q and reports whether it is to lead q
// (q had no leader). b.mu is held.
func (b *batcher) joinLocked(q *skuQueue, o *batchOrder) (leads bool) {
	o.queue = q
	q.pending = append(q.pending, o)
	if q.full != nil && len(q.pending) >= b.max {
		close(q.full)
		q.full = nil
	}
	leads = !q.led
	if leads {
		q.led, q.next = true, o
	}
	return leads
}

// withdraw takes o out of its queue if it is still only queued (neither in
// a batch nor told to lead).
func (b *batcher) withdraw(o *batchOrder) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := o.queue
	if q.next == o {
		return false
	}
	i := slices.Index(q.pending, o)
	if i < 0 {
		return false
	}
	q.pending = slices.Delete(q.pending, i, i+1)
	return true
}

// lead takes the next batch of q on self's goroutine, runs it, answers its
// orders and hands the lead on. self is the oldest queued order. A leader
// whose own deadline has passed, before it takes the batch or while it
// drops the expired orders from it, answers itself inventory.ErrBusy and
// hands the lead (and the rest of the batch, back at the head of the
// queue) to the next order without running anything, so it waits for no
// batch past its deadline: a batch runs on the goroutine of one of its own
// orders, under the earliest deadline among them.
//
// A panic while the batch runs answers every order of it not yet answered
// inventory.ErrUnavailable and hands the lead on before it goes on up
// self's stack (net/http recovers a handler's panic and the process lives
// on): the batch's other orders do not wait forever, and the SKU is not
// left led by no one.
func (b *batcher) lead(q *skuQueue, self *batchOrder) {
	if b.wait > 0 {
		b.waitForMore(q, self)
	}
	b.mu.Lock()
	q.next = nil
	if self.ctx.Err() != nil {
		if i := slices.Index(q.pending, self); i >= 0 {
			q.pending = slices.Delete(q.pending, i, i+1)
		}
		b.answer(self, batchResult{err: busyQueued(self.ctx)})
		b.handOffLocked(q)
		b.mu.Unlock()
		return
	}
	n := min(b.max, len(q.pending))
	taken := slices.Clone(q.pending[:n])
	q.pending = slices.Delete(q.pending, 0, n)
	b.mu.Unlock()

	handedOff := false
	defer func() {
		if handedOff {
			return
		}
		// Panicking (or runtime.Goexit): no recover, so the panic goes
		// on with its stack once the batch is answered and the lead
		// handed on.
		for _, o := range taken {
			if !o.answered {
				b.answer(o, batchResult{err: fmt.Errorf("%w: the batch's leader panicked", inventory.ErrUnavailable)})
			}
		}
		b.handOff(q)
	}()

	// Orders whose deadline passed while queued leave the batch.
	batch := make([]*batchOrder, 0, len(taken))
	for _, o := range taken {
		if o.ctx.Err() != nil {
			b.answer(o, batchResult{err: busyQueued(o.ctx)})
			continue
		}
		batch = append(batch, o)
	}
	if self.answered {
		// Its deadline passed after the check above: the batch goes back
		// to the head of the queue, for the next order to lead.
		b.mu.Lock()
		q.pending = append(batch, q.pending...)
		b.mu.Unlock()
		batch, taken = nil, nil // queued again: no longer this leader's to answer
	}
	if len(batch) > 0 {
		run := b.run
		if q.held {
			run = b.runHeld
		}
		ctx, cancel := batchContext(self.ctx, batch)
		// A lane's batches go through one node of a cluster whose every
		// node takes writes, whichever SKU its leader ordered; a held
		// SKU's batches through its lane's node too, where the lane's
		// batch that holds its row is (found by review: through another
		// node the held batch took the row at once, and its commit
		// failed the lane's whole batch at certification).
		ctx = inventory.WithAffinity(ctx, b.laneOf(batch[0].sku))
		results := run(ctx, batch)
		cancel()
		var rowHeld []*batchOrder
		for i, o := range batch {
			switch {
			case errors.Is(results[i].err, errRowHeld) && q.held:
				// A held queue's batch waits for its row: it cannot
				// find it held. Never moved twice.
				b.answer(o, batchResult{err: fmt.Errorf("%w: a batch that waits for its row found it held", inventory.ErrUnavailable)})
			case errors.Is(results[i].err, errRowHeld):
				rowHeld = append(rowHeld, o)
			default:
				b.answer(o, results[i])
			}
		}
		if len(rowHeld) > 0 {
			b.moveToHeld(q, rowHeld)
		}
		// Every order taken is answered or queued again: none is this
		// leader's to answer should the hand-off panic.
		taken = nil
	}
	b.handOff(q)
	handedOff = true
}

// moveToHeld moves the orders of a lane's batch whose SKU's row was held
// (in the batch's order) to their SKU's queue, with that SKU's orders
// still queued in the lane q behind them, which came later; a queue
// created for them is led by its oldest order. Nothing of them was
// decided, so none is answered.
func (b *batcher) moveToHeld(q *skuQueue, rowHeld []*batchOrder) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var leaders []*batchOrder
	skus := map[string]bool{}
	join := func(o *batchOrder) {
		h := b.held[o.sku]
		if h == nil {
			h = &skuQueue{lane: o.sku, held: true}
			b.held[o.sku] = h
		}
		if b.joinLocked(h, o) {
			leaders = append(leaders, o)
		}
	}
	for _, o := range rowHeld {
		skus[o.sku] = true
		join(o)
	}
	kept := q.pending[:0]
	for _, o := range q.pending {
		if skus[o.sku] {
			join(o)
			continue
		}
		kept = append(kept, o)
	}
	clear(q.pending[len(kept):])
	q.pending = kept
	for _, o := range leaders {
		b.observe.Woken(o.ctx)
		o.lead <- o.queue
	}
}

// waitForMore waits up to b.wait for the queue to fill, unless it is full
// already, and at most half the time self's deadline leaves, so the batch
// still has time to run.
func (b *batcher) waitForMore(q *skuQueue, self *batchOrder) {
	wait := b.wait
	if d, ok := self.ctx.Deadline(); ok {
		wait = min(wait, time.Until(d)/2)
	}
	if wait <= 0 {
		return
	}
	b.mu.Lock()
	if len(q.pending) >= b.max {
		b.mu.Unlock()
		return
	}
	full := make(chan struct{})
	q.full = full
	b.mu.Unlock()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-full:
	case <-self.ctx.Done():
	}
	b.mu.Lock()
	if q.full == full {
		q.full = nil
	}
	b.mu.Unlock()
}

// handOff hands the lead on (handOffLocked) under b.mu.
func (b *batcher) handOff(q *skuQueue) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handOffLocked(q)
}

// handOffLocked tells the oldest queued order to lead the next batch, or
// forgets the queue when nothing is queued. b.mu is held.
func (b *batcher) handOffLocked(q *skuQueue) {
	if len(q.pending) == 0 {
		q.led, q.next = false, nil
		if q.held {
			delete(b.held, q.lane)
		} else {
			delete(b.queues, q.lane)
		}
		return
	}
	q.next = q.pending[0]
	b.observe.Woken(q.next.ctx)
	q.next.lead <- q
}

// answer hands o its answer (never blocks: done is buffered and o is
// answered once).
func (b *batcher) answer(o *batchOrder, r batchResult) {
	o.answered = true
	b.observe.Woken(o.ctx)
	o.done <- r
}

// batchContext is the context a batch runs under: the leader's values, no
// cancellation (a client that hangs up leaves a whole batch or nothing), and
// the earliest deadline among the batch's orders.
func batchContext(leader context.Context, batch []*batchOrder) (context.Context, context.CancelFunc) {
	var earliest time.Time
	for _, o := range batch {
		if d, ok := o.ctx.Deadline(); ok && (earliest.IsZero() || d.Before(earliest)) {
			earliest = d
		}
	}
	base := context.WithoutCancel(leader)
	if earliest.IsZero() {
		return context.WithCancel(base)
	}
	return context.WithDeadline(base, earliest)
}
