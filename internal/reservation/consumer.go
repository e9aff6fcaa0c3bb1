package reservation

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// Sink is what a Consumer needs from the database.
type Sink interface {
	// PersistReserved writes in one transaction the orders of sale epoch
	// that are not there yet, deducts their total and stores their
	// idempotency records; orders already there are skipped. It returns
	// how many it wrote, or inventory.ErrStaleSale when the SKU's sale is
	// no longer epoch (nothing is written).
	PersistReserved(ctx context.Context, sku string, epoch int64, orders []inventory.Order, keys []inventory.IdempotencyRecord) (int, error)
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

// WithBatch bounds the orders read from one SKU's stream and written in one
// transaction. Default 512.
func WithBatch(n int) ConsumerOption { return func(c *Consumer) { c.batch = int64(max(1, n)) } }

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

// stream is a SKU of the working set.
type stream struct {
	sku string
	// own: this consumer may hold pending entries of the stream (a batch
	// it could not write, or entries it held before this process knew the
	// SKU): the next read asks for those ("0") before new ones (">").
	own bool
	// claimed is when the entries other consumers left idle were last
	// claimed from the stream.
	claimed time.Time
}

// workingSet is the SKUs whose streams may hold entries, taken a round at
// a time in turn: a round's cost is bounded by roundSKUs, however many
// SKUs have unwritten orders.
type workingSet struct {
	byKey map[string]*stream
	// turn holds every stream of byKey once, in the order of their next
	// round, and streams that left byKey since (skipped when their turn
	// comes).
	turn []*stream
}

func (w *workingSet) add(sku string, own bool) (added bool) {
	if w.byKey[sku] != nil {
		return false
	}
	st := &stream{sku: sku, own: own, claimed: time.Now()}
	w.byKey[sku] = st
	w.turn = append(w.turn, st)
	return true
}

func (w *workingSet) remove(st *stream) {
	if w.byKey[st.sku] == st {
		delete(w.byKey, st.sku)
	}
}

// next returns up to n streams whose turn it is, and puts them at the end
// of the line.
func (w *workingSet) next(n int) []*stream {
	var round []*stream
	for scanned, total := 0, len(w.turn); scanned < total && len(round) < n; scanned++ {
		st := w.turn[0]
		w.turn = w.turn[1:]
		if w.byKey[st.sku] != st {
			continue // it left the set
		}
		round = append(round, st)
		w.turn = append(w.turn, st)
	}
	if cap(w.turn) > 4*len(w.turn)+64 {
		w.turn = append([]*stream(nil), w.turn...) // let the old array go
	}
	return round
}

// roundSKUs bounds the streams one round reads: with a catalog of
// unwritten orders, rounds take them in turn.
const roundSKUs = 256

// writers is how many SKUs' batches of a round are written at once, each
// in its own transaction on the database pool.
const writers = 8

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
	stream := c.store.keys(sku).orders
	for _, from := range []string{"0", ">"} {
		streams, err := c.store.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: Group, Consumer: c.name, Streams: []string{stream, from}, Count: c.batch, Block: -1,
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
		if !c.write(ctx, sku, msgs) {
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

// readAndWrite reads the round's streams once (our pending entries where
// we may have some, new ones elsewhere) and writes what it read, several
// SKUs at once; a stream found empty leaves the working set. It reports
// whether it wrote anything and whether something failed.
func (c *Consumer) readAndWrite(ctx context.Context, working *workingSet, round []*stream) (progress, failed bool) {
	if len(round) == 0 {
		return false, false
	}
	type read struct {
		st      *stream
		entries *redis.XStreamSliceCmd
		length  *redis.IntCmd
	}
	reads := make([]read, 0, len(round))
	_, err := c.store.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, st := range round {
			from := ">"
			if st.own {
				from = "0"
			}
			key := c.store.keys(st.sku).orders
			reads = append(reads, read{st: st,
				entries: p.XReadGroup(ctx, &redis.XReadGroupArgs{Group: Group, Consumer: c.name, Streams: []string{key, from}, Count: c.batch, Block: -1}),
				// After the read: 0 means nothing was there to read.
				length: p.XLen(ctx, key),
			})
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) && !isNoGroup(err) && ctx.Err() == nil {
		// A stream without its group is a SKU being loaded; anything
		// else is Redis out of reach.
		c.log.Warn("reservation consumer: reading the streams failed", "consumer", c.name, "err", err)
	}
	var batches []batch
	for _, r := range reads {
		st := r.st
		streams, err := r.entries.Result()
		if err != nil && !errors.Is(err, redis.Nil) && !isNoGroup(err) {
			failed = true
			continue
		}
		// NOGROUP: no stream, or one being loaded; read like an empty one
		// (found by review: a wiped SKU stayed in the working set and was
		// read every poll).
		var msgs []redis.XMessage
		for _, s := range streams {
			msgs = append(msgs, s.Messages...)
		}
		if len(msgs) == 0 {
			switch n, lerr := r.length.Result(); {
			case st.own:
				st.own = false // none of ours: read new entries next
			case lerr == nil && n == 0:
				working.remove(st)
			}
			continue
		}
		batches = append(batches, batch{st, msgs})
	}
	p, f := c.writeAll(ctx, batches)
	return p, failed || f
}

// batch is entries read from one SKU's stream.
type batch struct {
	st   *stream
	msgs []redis.XMessage
}

// writeAll writes batches of different SKUs, up to writers at once: a
// catalog's orders are one transaction per SKU, and one at a time they
// would queue behind each other's commits.
func (c *Consumer) writeAll(ctx context.Context, batches []batch) (progress, failed bool) {
	ok := make([]bool, len(batches))
	var wg sync.WaitGroup
	slots := make(chan struct{}, writers)
	for i, b := range batches {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			ok[i] = c.write(ctx, b.st.sku, b.msgs)
		})
	}
	wg.Wait()
	for i, b := range batches {
		if ok[i] {
			progress = true
		} else {
			b.st.own, failed = true, true
		}
	}
	return progress, failed
}

// claim takes over the entries of the round's streams that other consumers
// left idle for the claim bound, and writes them; a stream is asked at
// most once per claim period.
func (c *Consumer) claim(ctx context.Context, round []*stream) (progress, failed bool) {
	type claimed struct {
		st  *stream
		cmd *redis.XAutoClaimCmd
	}
	now := time.Now()
	var claims []claimed
	_, _ = c.store.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, st := range round {
			if now.Sub(st.claimed) < c.claimEvery {
				continue
			}
			st.claimed = now
			claims = append(claims, claimed{st, p.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: c.store.keys(st.sku).orders, Group: Group, Consumer: c.name,
				MinIdle: c.claimIdle, Start: "0-0", Count: c.batch,
			})})
		}
		return nil
	})
	var batches []batch
	for _, cl := range claims {
		msgs, _, err := cl.cmd.Result()
		if err != nil {
			if !errors.Is(err, redis.Nil) && !isNoGroup(err) && ctx.Err() == nil {
				failed = true
			}
			continue
		}
		if len(msgs) == 0 {
			continue
		}
		c.log.Info("reservation consumer: claimed orders another consumer left pending", "consumer", c.name, "sku", cl.st.sku, "orders", len(msgs))
		batches = append(batches, batch{cl.st, msgs})
	}
	p, f := c.writeAll(ctx, batches)
	return p, failed || f
}

// relist lists in the catalog, if they are not there, SKUs this process
// just sold: a Redis that came back from an older copy of the catalog's
// master (on a cluster, another master than the SKU's, whose id did not
// change) may have lost their listings, and without one the orders of an
// instance that dies before its consumer reads them would be found by no
// sweep (found by review). Score 0: any sale started since outranks it.
func (c *Consumer) relist(ctx context.Context, skus []string) {
	if len(skus) == 0 {
		return
	}
	members := make([]redis.Z, len(skus))
	for i, sku := range skus {
		members[i] = redis.Z{Score: 0, Member: sku}
	}
	if err := c.store.rdb.ZAddNX(ctx, c.store.catalogKey(), members...).Err(); err != nil && ctx.Err() == nil {
		c.log.Warn("reservation consumer: listing sold SKUs in the catalog failed", "consumer", c.name, "skus", len(skus), "err", err)
	}
}

// sweep reads the page of the catalog at cursor from (ZSCAN, about
// c.sweepPage SKUs; 0 begins a walk) and returns the SKUs whose streams
// hold entries, and the cursor of the next page (0 after the last page:
// the next walk starts over). ZSCAN returns every SKU listed for a whole
// walk at least once, whatever joins, leaves or changes its score
// meanwhile; an index into the sorted set did not: a SKU leaving before
// the index made the next page skip one (found by review). A SKU whose
// sale is sold out and whose stream is empty leaves the catalog
// (retireScript: unless a StartSale has announced a newer sale since). On
// an error the next sweep reads the same page again.
func (c *Consumer) sweep(ctx context.Context, from uint64) (found []string, next uint64) {
	rdb := c.store.rdb
	flat, next, err := rdb.ZScan(ctx, c.store.catalogKey(), from, "", c.sweepPage).Result()
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("reservation consumer: reading the catalog failed", "consumer", c.name, "err", err)
		}
		return nil, from
	}
	type listed struct {
		sku   string
		score float64
	}
	var page []listed
	for i := 0; i+1 < len(flat); i += 2 {
		score, err := strconv.ParseFloat(flat[i+1], 64)
		if err != nil {
			continue
		}
		page = append(page, listed{flat[i], score})
	}
	// The sale before the stream: once a sale is seen sold out, it takes
	// no more orders, so a stream then found empty stays empty for that
	// sale, and a newer sale raises the score before it opens (the retire
	// then refuses). Read the other way round, an order taking the last
	// unit between the two reads left an entry in a stream the sweep had
	// seen empty, and the SKU left the catalog with it (found by review).
	sales := make([]*redis.SliceCmd, len(page))
	lengths := make([]*redis.IntCmd, len(page))
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, l := range page {
			sales[i] = p.HMGet(ctx, c.store.keys(l.sku).sale, "available", "base")
		}
		for i, l := range page {
			lengths[i] = p.XLen(ctx, c.store.keys(l.sku).orders)
		}
		return nil
	})
	for i, l := range page {
		n, err := lengths[i].Result()
		if err != nil {
			continue
		}
		if n > 0 {
			found = append(found, l.sku)
			continue
		}
		v, err := sales[i].Result()
		if err != nil || len(v) != 2 {
			continue
		}
		available, _ := v[0].(string)
		base, err := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
		if available == "0" && err == nil && l.score <= float64(base) {
			if err := retireScript.Run(ctx, rdb, []string{c.store.catalogKey()}, l.sku, base).Err(); err != nil && ctx.Err() == nil {
				c.log.Warn("reservation consumer: taking a finished sale off the catalog failed", "sku", l.sku, "err", err)
			}
		}
	}
	return found, next
}

// reserved is one stream entry, decoded.
type reserved struct {
	streamID string
	epoch    int64
	order    inventory.Order
	key      inventory.IdempotencyRecord
	accepted time.Time
}

// write writes msgs (one SKU's entries, oldest first) to the database,
// one transaction per sale epoch among them, then acknowledges and deletes
// them. It reports whether all of them are done with.
func (c *Consumer) write(ctx context.Context, sku string, msgs []redis.XMessage) bool {
	// The batch is finished even if ctx ends meanwhile, under a bound of
	// its own: stopping now would leave it to be claimed later.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.writeLimit)
	defer cancel()
	var (
		group []reserved
		done  []string
	)
	flush := func() bool {
		if len(group) == 0 {
			return true
		}
		orders := make([]inventory.Order, len(group))
		var keys []inventory.IdempotencyRecord
		for i, r := range group {
			orders[i] = r.order
			if r.key.Key != "" {
				keys = append(keys, r.key)
			}
		}
		written, err := c.sink.PersistReserved(wctx, sku, group[0].epoch, orders, keys)
		switch {
		case errors.Is(err, inventory.ErrStaleSale):
			// A restarted sale's orders, or orders a check of Redis has
			// written already or fenced off (see Store.recheck).
			c.log.Warn("reservation consumer: dropped a batch of an older sale number", "sku", sku, "epoch", group[0].epoch, "orders", len(group), "err", err)
		case err != nil:
			c.log.Error("reservation consumer: batch not written; it stays pending and is tried again",
				"consumer", c.name, "sku", sku, "orders", len(group), "err", err)
			c.obs.Failed(sku)
			return false
		default:
			// Which of the batch's orders were new is not known (a
			// redelivered batch skips those written before): the oldest
			// stand for them.
			now := time.Now()
			lags := make([]time.Duration, written)
			for i := range lags {
				lags[i] = max(0, now.Sub(group[i].accepted))
			}
			c.obs.Written(sku, lags)
		}
		for _, r := range group {
			done = append(done, r.streamID)
		}
		group = group[:0]
		return true
	}
	ok := true
	for _, m := range msgs {
		r, err := decode(sku, m)
		if err != nil {
			// Only this package's script writes the stream: an entry it
			// cannot read is a bug, logged with its content.
			c.log.Error("reservation consumer: dropping an unreadable stream entry", "sku", sku, "entry", m.ID, "values", m.Values, "err", err)
			done = append(done, m.ID)
			continue
		}
		if len(group) > 0 && group[0].epoch != r.epoch {
			if ok = flush(); !ok {
				break
			}
		}
		group = append(group, r)
	}
	if ok {
		ok = flush()
	}
	if len(done) > 0 {
		stream := c.store.keys(sku).orders
		_, err := c.store.rdb.TxPipelined(wctx, func(p redis.Pipeliner) error {
			p.XAck(wctx, stream, Group, done...)
			p.XDel(wctx, stream, done...)
			return nil
		})
		if err != nil {
			// The orders are in the database; their entries will be read
			// again and written as nothing.
			c.log.Warn("reservation consumer: written orders not yet acknowledged", "sku", sku, "orders", len(done), "err", err)
			return false
		}
	}
	return ok
}

// decode reads one stream entry written by the reserve script.
func decode(sku string, m redis.XMessage) (reserved, error) {
	field := func(name string) string { s, _ := m.Values[name].(string); return s }
	epoch, err := strconv.ParseInt(field("e"), 10, 64)
	if err != nil {
		return reserved{}, fmt.Errorf("epoch: %w", err)
	}
	q, err := strconv.ParseInt(field("q"), 10, 64)
	if err != nil {
		return reserved{}, fmt.Errorf("quantity: %w", err)
	}
	ms, err := strconv.ParseInt(strings.SplitN(m.ID, "-", 2)[0], 10, 64)
	if err != nil {
		return reserved{}, fmt.Errorf("entry id: %w", err)
	}
	r := reserved{
		streamID: m.ID, epoch: epoch, accepted: time.UnixMilli(ms),
		order: inventory.Order{ID: field("id"), SKU: sku, Quantity: q, UserID: field("u"), Strategy: field("s")},
	}
	if r.order.Strategy == "" {
		r.order.Strategy = inventory.NameRedisReserve
	}
	if r.order.ID == "" || r.order.UserID == "" {
		return reserved{}, errors.New("order id or user id missing")
	}
	if key := field("k"); key != "" {
		fp, err := hex.DecodeString(field("h"))
		if err != nil {
			return reserved{}, fmt.Errorf("fingerprint: %w", err)
		}
		r.key = inventory.IdempotencyRecord{Key: key, SKU: sku, RequestHash: fp, OrderID: r.order.ID}
	}
	return r, nil
}

func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}
