package batched

import (
	"context"
	"log/slog"
	"time"
)

// Observer hears about the batches of the batched strategy, for metrics.
// It is called on an order's goroutine: cheap and safe for concurrent use.
type Observer interface {
	// BatchDone reports a batch's size, how long its transaction took
	// (retries included) and its outcome (see inventory.Outcome).
	BatchDone(size int, elapsed time.Duration, outcome string)
}

// QueueObserver hears of the orders that wait in the process for another
// order's goroutine: the batch's leader runs the transaction of every order
// in the batch. A scheduler that lets one order move at a time
// (lab/explore) needs to know that such an order is not stuck but
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

// retryObserver is the part of inventory.Observer an Observer may also
// have: the batch's retries are then counted with the other strategies'.
type retryObserver interface {
	Retried(strategy, reason string)
}

type nopObserver struct{}

func (nopObserver) BatchDone(int, time.Duration, string) {}

type config struct {
	lanes       int
	heldBatches int
	max         int
	wait        time.Duration
	attempts    int
	log         *slog.Logger
	obs         Observer
	queue       QueueObserver
}

// Option configures Batched.
type Option func(*config)

// WithMax bounds the orders of one batch. Default 256.
func WithMax(n int) Option {
	return func(c *config) { c.max = max(1, n) }
}

// WithLanes shares batches between SKUs: the orders of every SKU join one
// of n lanes (by a hash of the SKU), and a lane's batch takes its orders
// whatever their SKUs, one transaction for them all, while the lanes'
// batches run side by side. In a catalog, where a SKU seldom has two
// orders in flight, a batch of one SKU is one order and one commit; a
// lane's batch is many. A SKU always joins the same lane, so its orders
// are batched in arrival order as before. A lane's batch skips the rows
// other transactions hold, and their SKUs' orders move to queues of
// their own (see batcher), so a held row holds up its SKU only. Default
// 1, the biggest batches; 0: a batch per SKU, each waiting for its row.
func WithLanes(n int) Option {
	return func(c *config) { c.lanes = max(0, n) }
}

// WithHeldBatches bounds the batches of SKUs whose row a lane found held
// (see WithLanes) that run at once, each holding a connection while it
// waits for its row, so that the lanes keep the rest of the pool however
// many rows are held. Default 4.
func WithHeldBatches(n int) Option {
	return func(c *config) { c.heldBatches = max(1, n) }
}

// WithWait makes the leader of a batch wait up to d for more orders (less
// if the batch fills, and at most half the time the leader's deadline
// leaves) before it takes the queue. Default 0: no wait; the batch is what
// queued while the previous transaction of the SKU ran.
func WithWait(d time.Duration) Option {
	return func(c *config) { c.wait = max(0, d) }
}

// WithTxAttempts bounds how often a batch's transaction runs again
// after a conflict (deadlock, serialisation failure). Default 5; then its
// orders are busy. A retry after a concurrent commit of one of its
// idempotency keys (which the next run replays) counts only once the batch
// has had as many of those as it has keyed orders.
func WithTxAttempts(n int) Option {
	return func(c *config) { c.attempts = max(1, n) }
}

// WithLogger sets the logger of failed batches. Default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.log = l }
}

// WithObserver sets who hears about batches. Default: nobody.
func WithObserver(o Observer) Option {
	return func(c *config) { c.obs = o }
}

// WithQueueObserver sets who hears of orders waiting for their batch.
// Default: nobody.
func WithQueueObserver(o QueueObserver) Option {
	return func(c *config) { c.queue = o }
}
