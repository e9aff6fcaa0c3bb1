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

// writers is how many SKUs' batches of a round are written at once, each
// in its own transaction on the database pool.
const writers = 8

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
