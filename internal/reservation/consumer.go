package reservation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Sink is what a Consumer needs from the database.
type Sink interface {
	// PersistReservedEach writes the batches of many SKUs in one
	// transaction. Of each batch it writes the orders that are not there
	// yet, deducts their total and stores their idempotency records;
	// orders already there are skipped. Each batch has its outcome: how
	// many it wrote, or inventory.ErrStaleSale when its SKU's sale is no
	// longer its Epoch, or inventory.ErrUnavailable when the database does
	// not have that sale yet (nothing of the batch is written in either
	// case). An error of the call itself means nothing was written.
	PersistReservedEach(ctx context.Context, batches []SaleBatch) ([]SaleBatchOutcome, error)
}

// Observer hears what a Consumer does, for metrics. It is called from the
// consumer's writers, several at once.
type Observer interface {
	// Written reports a batch committed to the database: for each order
	// written, the time from its acceptance to the commit.
	Written(sku string, lags []time.Duration)
	// Failed reports a batch the database did not take; it stays pending
	// and is tried again.
	Failed(sku string)
}

type nopObserver struct{}

func (nopObserver) Written(string, []time.Duration) {}
func (nopObserver) Failed(string)                   {}

// Consumer writes the orders of every SKU's stream to the database. Each
// instance runs one, under its own name, in the streams' consumer group:
// an entry goes to one consumer, which acknowledges and deletes it only
// after the database committed it. A consumer that dies leaves its entries
// pending; the others claim them once they have been idle for the claim
// bound (XAUTOCLAIM), and writing them again writes nothing twice (the
// order id is the primary key).
//
// A consumer reads only the streams that may hold entries: its working
// set. A SKU joins it when this process logs an order of it (at once,
// through Store.touch) or when the sweep finds entries in its stream, and
// leaves it when its stream is empty. The sweep walks the catalog every
// sweep period, a page at a time, for the streams no live instance is
// reading: those of an instance that died before its consumer read them.
// So an idle consumer sends nothing but the sweep, and its work per round
// grows with the SKUs that have unwritten orders, not with the catalog.
type Consumer struct {
	store      *Store
	sink       Sink
	name       string
	batch      int64
	poll       time.Duration
	claimIdle  time.Duration
	claimEvery time.Duration
	sweepEvery time.Duration
	sweepPage  int64
	writeLimit time.Duration
	log        *slog.Logger
	obs        Observer
}

// ConsumerOption configures NewConsumer.
type ConsumerOption func(*Consumer)

// WithConsumerName names the consumer in the group. Default: host name,
// process id and a random suffix, so a restarted process is a new consumer
// and its predecessor's entries are claimed like any dead consumer's.
func WithConsumerName(n string) ConsumerOption { return func(c *Consumer) { c.name = n } }

// WithBatch bounds the orders read from one SKU's stream in one round, all
// written in one transaction (with other SKUs' when they fit). Default
// 512, at most 2,048 (a transaction's orders: one statement's placeholders
// on MariaDB, one script's arguments on Redis).
func WithBatch(n int) ConsumerOption {
	return func(c *Consumer) { c.batch = int64(min(max(1, n), txOrders)) }
}

// WithWriteLimit bounds one transaction's write and the acknowledgement of
// its entries, from its start; a write cut by it is tried again. Default
// 10s.
func WithWriteLimit(d time.Duration) ConsumerOption {
	return func(c *Consumer) { c.writeLimit = max(time.Millisecond, d) }
}

// WithPoll sets how often a consumer whose working set is not empty reads
// it again when a round wrote nothing (entries of another consumer, not
// yet idle long enough to claim). Orders taken in its own process wake it
// at once; with an empty working set it waits for them or the sweep.
// Default 10ms.
func WithPoll(d time.Duration) ConsumerOption {
	return func(c *Consumer) { c.poll = max(time.Millisecond, d) }
}

// WithClaimIdle sets how long another consumer's entry must have been idle
// before this one claims it. It must exceed a healthy batch's write, or
// live consumers would take each other's work (harmless, but wasted).
// Default 5s.
func WithClaimIdle(d time.Duration) ConsumerOption {
	return func(c *Consumer) { c.claimIdle = max(time.Millisecond, d) }
}

// WithSweep sets how often the consumer reads the next page of the
// catalog (WithSweepPage SKUs) for streams that hold entries nobody is
// reading (an instance died before its consumer read them), and takes
// sales sold out and drained off it. A page that found such entries is
// followed by the next one a tenth of the period later, so that a
// catalog of orders left behind is taken up at ten pages a period. The
// idle cost is one page per period, whatever the catalog's size: two
// commands per SKU, pipelined, 200 a second with the defaults. An idle
// walk of the whole catalog takes catalog/page periods: 100 s for
// 10,000 SKUs. Default 10s.
func WithSweep(d time.Duration) ConsumerOption {
	return func(c *Consumer) { c.sweepEvery = max(10*time.Millisecond, d) }
}

// WithSweepPage sets about how many SKUs of the catalog one sweep reads
// (ZSCAN's COUNT, a hint), in one pipelined round trip. Default 1,000.
func WithSweepPage(n int) ConsumerOption {
	return func(c *Consumer) { c.sweepPage = int64(max(1, n)) }
}

// WithConsumerLogger sets the logger. Default slog.Default().
func WithConsumerLogger(l *slog.Logger) ConsumerOption { return func(c *Consumer) { c.log = l } }

// WithConsumerObserver sets who hears about batches. Default: nobody.
func WithConsumerObserver(o Observer) ConsumerOption { return func(c *Consumer) { c.obs = o } }

// NewConsumer returns a consumer of s's streams writing into sink. Run
// runs it.
func (s *Store) NewConsumer(sink Sink, opts ...ConsumerOption) *Consumer {
	host, _ := os.Hostname()
	c := &Consumer{
		store: s, sink: sink,
		name:  fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8]),
		batch: 512, poll: 10 * time.Millisecond, claimIdle: 5 * time.Second, sweepEvery: 10 * time.Second, sweepPage: 1000,
		writeLimit: 10 * time.Second, log: slog.Default(), obs: nopObserver{},
	}
	for _, o := range opts {
		o(c)
	}
	c.claimEvery = min(time.Second, c.claimIdle)
	return c
}

// Name returns the consumer's name in the group.
func (c *Consumer) Name() string { return c.name }

// Run writes orders until ctx ends, and returns nil then. A batch being
// written when ctx ends is finished (bounded by its own deadline), so a
// shutdown does not leave it to be claimed.
func (c *Consumer) Run(ctx context.Context) error {
	var (
		working   = &workingSet{byKey: map[string]*stream{}}
		nextSweep time.Time // now: the streams left by earlier instances
		sweepFrom uint64    // the ZSCAN cursor of the next sweep's page
		backoff   time.Duration
	)
	for ctx.Err() == nil {
		var joined []string
		for _, sku := range c.store.takeTouched() {
			if working.add(sku, false) {
				joined = append(joined, sku)
			}
		}
		c.relist(ctx, joined)
		if !time.Now().Before(nextSweep) {
			var found []string
			found, sweepFrom = c.sweep(ctx, sweepFrom)
			for _, sku := range found {
				working.add(sku, true)
			}
			if len(found) > 0 && sweepFrom > 0 {
				nextSweep = time.Now().Add(c.sweepEvery / 10) // more may be left further on
			} else {
				nextSweep = time.Now().Add(c.sweepEvery)
			}
		}
		round := working.next(roundSKUs)
		progress, failed := c.claim(ctx, round)
		p, f := c.readAndWrite(ctx, working, round)
		progress, failed = progress || p, failed || f
		switch {
		case failed:
			backoff = min(2*time.Second, max(100*time.Millisecond, 2*backoff))
			c.wait(ctx, backoff)
		case progress:
			backoff = 0
		case len(working.byKey) > 0:
			backoff = 0
			c.wait(ctx, c.poll)
		default:
			// Nothing to read: sleep until an order of this process or
			// the next sweep.
			backoff = 0
			c.wait(ctx, time.Until(nextSweep))
		}
	}
	return nil
}

// WriteOnce writes one batch of sku's stream: this consumer's pending
// entries if it has some, else new ones, as Run would. It returns how many
// entries it took off the stream (written, or dropped as a restarted
// sale's). For callers that decide when the consumer moves (the schedule
// explorer) instead of Run.
func (c *Consumer) WriteOnce(ctx context.Context, sku string) (int, error) {
	key := c.store.keys(sku).orders
	for _, from := range []string{"0", ">"} {
		streams, err := c.store.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: Group, Consumer: c.name, Streams: []string{key, from}, Count: c.batch, Block: -1,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return 0, err
		}
		var msgs []redis.XMessage
		for _, st := range streams {
			msgs = append(msgs, st.Messages...)
		}
		if len(msgs) == 0 {
			continue
		}
		if ok := c.writeBatches(ctx, []batch{{&stream{sku: sku}, msgs}}); !ok[0] {
			return 0, fmt.Errorf("reservation consumer: the batch of %d orders of %q was not written", len(msgs), sku)
		}
		return len(msgs), nil
	}
	return 0, nil
}

// wait returns after d, when this process takes an order, or when ctx ends.
func (c *Consumer) wait(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-c.store.wake:
	case <-ctx.Done():
	}
}
