package reservation

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// claim takes over the entries of the round's streams that other consumers
// left idle for the claim bound, and writes them; a stream is asked at
// most once per claim period.
func (c *Consumer) claim(ctx context.Context, round []*stream) (progress, failed bool) {
	type claimed struct {
		st  *stream
		cmd *redis.XAutoClaimCmd
	}
	now := time.Now()
	var (
		claims     []claimed
		replicated *replicaWait
	)
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
		if len(claims) > 0 {
			replicated = c.store.awaitReadsReplicated(ctx, p)
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
	if len(batches) > 0 && !c.store.readsReplicated(replicated) {
		// Claimed, but not on the replicas yet (replicas.go): ours now,
		// read again from our pending entries next round.
		for _, b := range batches {
			b.st.own = true
		}
		return false, true
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
