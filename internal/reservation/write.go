package reservation

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// A round's orders are written across SKUs: a catalog has no hot row, so
// one SKU's batch is mostly a single order, and a transaction each made
// the drain commit-bound (issue 38). Up to txOrders orders of many SKUs
// go in one transaction (a SKU's batch is never split), and up to writers
// such transactions run at once, each on SKUs of its own.
const (
	txOrders = 2048
	writers  = 8
)

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
	var replicated *replicaWait
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
		replicated = c.store.awaitReadsReplicated(ctx, p)
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
	if len(batches) > 0 && !c.store.readsReplicated(replicated) {
		// Not on the replicas yet (replicas.go): read again next round.
		for _, b := range batches {
			b.st.own = true
		}
		c.log.Debug("reservation consumer: the replicas do not have the entries read yet", "consumer", c.name, "streams", len(batches))
		return false, true
	}
	p, f := c.writeAll(ctx, batches)
	return p, failed || f
}

// batch is entries read from one SKU's stream.
type batch struct {
	st   *stream
	msgs []redis.XMessage
}

// skuWrite is a batch being written: its entries decoded and grouped by
// sale, and the entries done with (written, dropped as an older sale's, or
// unreadable), to acknowledge.
type skuWrite struct {
	batch
	sales []saleEntries
	done  []string
	ok    bool
}

// saleEntries is entries of one SKU of one sale, oldest first.
type saleEntries struct {
	epoch   int64
	entries []reserved
}

func (w *skuWrite) orders() (n int) {
	for _, s := range w.sales {
		n += len(s.entries)
	}
	return n
}

// writeAll writes batches of different SKUs to the database, then
// acknowledges and deletes their entries done with. A batch's entries that
// were not written stay pending, and its stream is read from its pending
// entries next time (own). It reports whether anything was written and
// whether something failed.
func (c *Consumer) writeAll(ctx context.Context, batches []batch) (progress, failed bool) {
	ok := c.writeBatches(ctx, batches)
	for i, b := range batches {
		if ok[i] {
			progress = true
		} else {
			b.st.own, failed = true, true
		}
	}
	return progress, failed
}

// writeBatches writes batches (each of one SKU, no two of the same) and
// reports of each whether every entry of it is done with. Each
// transaction's entries are acknowledged as soon as it commits, so a slow
// transaction never holds back the acknowledgement of the others.
func (c *Consumer) writeBatches(ctx context.Context, batches []batch) []bool {
	writes := make([]*skuWrite, len(batches))
	for i, b := range batches {
		writes[i] = c.decodeBatch(b)
	}
	var (
		wg       sync.WaitGroup
		slots    = make(chan struct{}, writers)
		chunk    []*skuWrite
		size     int
		nothing  []*skuWrite // entries all unreadable: only to acknowledge
		chunkOut = func(ws []*skuWrite, write bool) {
			// A chunk is finished even if ctx ends meanwhile, under a
			// bound of its own from its start: stopping now would leave
			// it to be claimed later.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.writeLimit)
			defer cancel()
			if write {
				c.writeChunk(wctx, ws)
			}
			c.acknowledge(wctx, ws)
		}
	)
	flush := func() {
		if len(chunk) == 0 {
			return
		}
		ws := chunk
		chunk, size = nil, 0
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			chunkOut(ws, true)
		})
	}
	for _, w := range writes {
		n := w.orders()
		if n == 0 {
			nothing = append(nothing, w)
			continue
		}
		if size > 0 && size+n > txOrders {
			flush()
		}
		chunk, size = append(chunk, w), size+n
	}
	flush()
	if len(nothing) > 0 {
		chunkOut(nothing, false)
	}
	wg.Wait()
	ok := make([]bool, len(writes))
	for i, w := range writes {
		ok[i] = w.ok
	}
	return ok
}

// decodeBatch decodes b's entries and groups them by sale, in order; an
// entry it cannot read is done with at once.
func (c *Consumer) decodeBatch(b batch) *skuWrite {
	w := &skuWrite{batch: b, ok: true}
	sku := b.st.sku
	for _, m := range b.msgs {
		r, err := decode(sku, m)
		if err != nil {
			// Only this package's script writes the stream: an entry it
			// cannot read is a bug, logged with its content.
			c.log.Error("reservation consumer: dropping an unreadable stream entry", "sku", sku, "entry", m.ID, "values", m.Values, "err", err)
			w.done = append(w.done, m.ID)
			continue
		}
		if n := len(w.sales); n == 0 || w.sales[n-1].epoch != r.epoch {
			w.sales = append(w.sales, saleEntries{epoch: r.epoch})
		}
		last := &w.sales[len(w.sales)-1]
		last.entries = append(last.entries, r)
	}
	return w
}

// writeChunk writes the sales of ws (SKUs no other chunk has) in one
// transaction and records each one's outcome.
// drainAffinity is the affinity of every consumer's writes.
const drainAffinity = "reservation-drain"

func (c *Consumer) writeChunk(ctx context.Context, ws []*skuWrite) {
	type ref struct {
		w    *skuWrite
		sale *saleEntries
	}
	var (
		batches []SaleBatch
		refs    []ref
	)
	for _, w := range ws {
		for i := range w.sales {
			s := &w.sales[i]
			b := SaleBatch{SKU: w.st.sku, Epoch: s.epoch, Orders: make([]inventory.Order, len(s.entries))}
			for j, r := range s.entries {
				b.Orders[j] = r.order
				if r.key.Key != "" {
					b.Keys = append(b.Keys, r.key)
				}
			}
			batches, refs = append(batches, b), append(refs, ref{w, s})
		}
	}
	// Every instance's drains go through one node of a cluster whose
	// every node takes writes (inventory.WithAffinity): a chunk holds many
	// SKUs, and two instances' chunks of one hot SKU written through two
	// nodes would conflict at certification.
	outcomes, err := c.sink.PersistReservedEach(inventory.WithAffinity(ctx, drainAffinity), batches)
	if err == nil && len(outcomes) != len(batches) {
		err = fmt.Errorf("%d outcomes for %d batches", len(outcomes), len(batches))
	}
	if err != nil {
		c.log.Error("reservation consumer: orders not written; they stay pending and are tried again",
			"consumer", c.name, "skus", len(ws), "batches", len(batches), "err", err)
		for _, w := range ws {
			w.ok = false
			c.obs.Failed(w.st.sku)
		}
		return
	}
	now := time.Now()
	for i, o := range outcomes {
		w, s := refs[i].w, refs[i].sale
		switch {
		case errors.Is(o.Err, inventory.ErrStaleSale):
			// A restarted sale's orders, or orders a check of Redis has
			// written already or fenced off (see Store.recheck).
			c.log.Warn("reservation consumer: dropped a batch of an older sale number", "sku", w.st.sku, "epoch", s.epoch, "orders", len(s.entries), "err", o.Err)
		case o.Err != nil:
			c.log.Error("reservation consumer: batch not written; it stays pending and is tried again",
				"consumer", c.name, "sku", w.st.sku, "orders", len(s.entries), "err", o.Err)
			w.ok = false
			c.obs.Failed(w.st.sku)
			continue
		default:
			// Which of the batch's orders were new is not known (a
			// redelivered batch skips those written before): the oldest
			// stand for them.
			lags := make([]time.Duration, min(o.Written, len(s.entries)))
			for j := range lags {
				lags[j] = max(0, now.Sub(s.entries[j].accepted))
			}
			c.obs.Written(w.st.sku, lags)
		}
		for _, r := range s.entries {
			w.done = append(w.done, r.streamID)
		}
	}
}

// acknowledge acknowledges and deletes the entries done with, a script per
// stream (atomic there), all in one pipeline: a transaction across streams
// would cross hash slots on Redis Cluster.
func (c *Consumer) acknowledge(ctx context.Context, ws []*skuWrite) {
	type ack struct {
		w   *skuWrite
		cmd *redis.Cmd
	}
	var acks []ack
	_, _ = c.store.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, w := range ws {
			if len(w.done) == 0 {
				continue
			}
			args := make([]any, 0, len(w.done)+1)
			args = append(args, Group)
			for _, id := range w.done {
				args = append(args, id)
			}
			acks = append(acks, ack{w, ackScript.Eval(ctx, p, []string{c.store.keys(w.st.sku).orders}, args...)})
		}
		return nil
	})
	for _, a := range acks {
		if err := a.cmd.Err(); err != nil {
			// The orders are in the database; their entries will be read
			// again and written as nothing.
			c.log.Warn("reservation consumer: written orders not yet acknowledged", "sku", a.w.st.sku, "orders", len(a.w.done), "err", err)
			a.w.ok = false
		}
	}
}

// reserved is one stream entry, decoded.
type reserved struct {
	streamID string
	epoch    int64
	order    inventory.Order
	key      inventory.IdempotencyRecord
	accepted time.Time
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
		r.order.Strategy = NameRedisReserve
	}
	// An entry of an earlier version has no hold: final.
	r.order.State = inventory.OrderFinal
	if hd := field("hd"); hd != "" && hd != "0" {
		ms, err := strconv.ParseInt(hd, 10, 64)
		if err != nil || ms < 0 {
			return reserved{}, fmt.Errorf("hold %q: %v", hd, err)
		}
		r.order.State, r.order.Hold = inventory.OrderHeld, time.Duration(ms)*time.Millisecond
		// The expiry the order's 201 promised: Redis's time of the order
		// (redis-watch's "at", else the entry's id) plus the hold. The
		// database writes it or its own now plus the hold, the later.
		taken := r.accepted
		if at := field("at"); at != "" {
			if taken = entryTime(at); taken.IsZero() {
				return reserved{}, fmt.Errorf("time %q", at)
			}
		}
		r.order.ExpiresAt = HoldEnds(taken, r.order.Hold)
	}
	if c := field("c"); c != "" {
		claimed, err := strconv.ParseInt(c, 10, 64)
		if err != nil || claimed < 0 {
			return reserved{}, fmt.Errorf("claimed %q: %v", c, err)
		}
		r.order.Claimed = claimed
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
