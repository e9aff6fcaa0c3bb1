package reservation

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
)

// errUnchecked: a Redis whose data may have changed could not be checked
// against the database, so the script was not run.
type errUnchecked struct{ error }

func (e errUnchecked) Error() string {
	return "redis not checked against the database: " + e.error.Error()
}

func (e errUnchecked) Unwrap() error { return e.error }

// checkTakeover is how long a check may stop a sale before the reserve
// script takes it for dead and lets another check begin (scripts.go), and
// so how long one check may run here.
const checkTakeover = 2 * time.Second

// recheck checks one SKU's sale (see checkSale), once at a time per
// SKU in this process: orders of the SKU that find it unchecked meanwhile
// wait for that check instead of starting their own. The check runs under
// its own bound (checkLimit), not the deadline of the order that began it:
// a check that outlives its buyer still ends, and the buyers after it find
// the sale open instead of starting over.
func (s *Store) recheck(ctx context.Context, sku string) error {
	return s.recheckAs(ctx, sku, "")
}

// recheckAs is recheck; force "force" checks a sale even if it was checked
// under the server's current replication id already (the reconciler found
// the database ahead of Redis: data put back into a running server keeps
// its id).
func (s *Store) recheckAs(ctx context.Context, sku, force string) error {
	if s.waitsForReplicas() {
		// A new replication id: perhaps a promoted replica, with replicas
		// of its own to count again (replicas.go). Counted from the old
		// primary's, every WAIT would wait its timeout out once.
		s.online.Store(unknownCount())
	}
	done := s.checks.DoChan(sku+"\x00"+force, func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.checkLimit)
		defer cancel()
		return nil, s.checkSale(cctx, sku, force)
	})
	select {
	case r := <-done:
		return r.Err
	case <-ctx.Done():
		return errUnchecked{fmt.Errorf("sale %q still being checked at the order's deadline: %w", sku, context.Cause(ctx))}
	}
}

// checkSale checks the SKU's sale in a Redis whose data may be another
// history than the one its orders were answered from. It runs in one
// database transaction that holds the SKU's row, so no batch commits and no
// other instance checks meanwhile:
//
//  0. the sale stops taking orders (the reserve script answers "checking");
//  1. the sale gets a new number in the database (its stock and orders
//     stay): every batch of an older number that a consumer still holds is
//     refused from the commit on. Such a batch may have been read from a
//     history Redis has lost since; written after the check it would sell
//     its units again (found by review);
//  2. if Redis holds another sale than the database's, it is closed (503)
//     and nothing of it is written; otherwise every order of the sale still
//     in the stream is written: they are the surviving history's, answered
//     201;
//  3. if the database now has more orders of the sale than Redis ever
//     accepted, Redis lost acknowledged orders, and the sale is closed;
//     otherwise Redis takes the new number, still stopped.
//
// After the commit, the sale sells again under the server's replication
// id. A check that fails leaves it stopped: the next order checks again.
func (s *Store) checkSale(ctx context.Context, sku, force string) error {
	k := s.keys(sku)
	token := uuid.NewString()
	var to int64
	err := s.ledger.RecheckSale(ctx, sku, func(ctx context.Context, r SaleRecheck) error {
		// First, no more orders of this sale until the check ends: on a
		// cluster a restart of one master makes every SKU be checked,
		// and the other masters' SKUs would otherwise keep selling under
		// the number about to be fenced off.
		blocked, err := blockScript.Run(ctx, s.rdb, []string{k.sale}, token, force).Int()
		if err != nil || blocked != 1 {
			// No sale (it fails closed already), or checked under this
			// server's id by another instance since the order asked.
			return err
		}
		t, err := s.Tally(ctx, sku)
		if err != nil {
			return err
		}
		written, err := r.Audit(ctx)
		if err != nil {
			return err
		}
		to = max(written.Sale, t.Epoch) + 1
		if err := r.Renumber(ctx, to); err != nil {
			return err
		}
		if !sameSale(written.Sale, t.Epoch) {
			// Redis holds another sale than the database's: its orders
			// must not be written into this one (found by review).
			return s.closeLost(ctx, sku, to, t, written)
		}
		if err := s.writeStream(ctx, sku, t.Epoch, r.Write); err != nil {
			return err
		}
		if written, err = r.Audit(ctx); err != nil {
			return err
		}
		if written.Orders > t.Orders || written.Ordered > t.Ordered {
			return s.closeLost(ctx, sku, to, t, written)
		}
		// Redis took every order the database has (both count every
		// order, returned or not): the returns the database made are
		// Redis's to take back.
		if err := s.returnAgain(ctx, sku, written.Sale, token, r); err != nil {
			return err
		}
		answer, err := renumberScript.Run(ctx, s.rdb, []string{k.sale, k.epoch}, t.Epoch, to, token).Text()
		if err != nil {
			return err
		}
		if answer != "OK" {
			return fmt.Errorf("renumber sale %d of %q in Redis: %s", t.Epoch, sku, answer)
		}
		return nil
	})
	if errors.Is(err, inventory.ErrUnknownSKU) {
		return nil
	}
	if err != nil {
		// Redis stays stopped ("checking", or renumbered and still
		// stopped): the next order checks again, at once rather than
		// after the 2 s in which a check is presumed alive.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = abandonScript.Run(actx, s.rdb, []string{k.sale}, token).Err()
		return errUnchecked{err}
	}
	if to > 0 {
		// After the commit only: a Redis that sold under the new number
		// before the database had it would leave orders no batch could
		// write if the commit failed (found by review).
		if err := unblockScript.Run(ctx, s.rdb, []string{k.sale}, to, token).Err(); err != nil {
			return errUnchecked{err}
		}
	}
	return nil
}

// closeLost closes a sale whose Redis lost acknowledged orders or holds
// another sale than the database: 503 until it is started again.
func (s *Store) closeLost(ctx context.Context, sku string, to int64, t Tally, written inventory.Audit) error {
	s.log.Error("redis has lost orders it had accepted, or holds another sale (it came back from an older copy of its data): the sale is closed until it is started again",
		"sku", sku, "redis_sale", t.Epoch, "redis_orders", t.Orders, "redis_ordered", t.Ordered,
		"database_sale", written.Sale, "database_orders", written.Orders, "database_ordered", written.Ordered)
	var behind *SaleNumberBehind
	if err := s.Close(ctx, sku, to); err != nil && !errors.As(err, &behind) {
		return err // (behind or not, the sale is closed)
	}
	return nil
}

// writeStream writes, through write, every order of epoch's sale still in
// the SKU's stream (orders written before are skipped). Under WithReplicas
// only what the replicas confirm (replicas.go): an order the database has
// and a promoted replica lacks would close the sale (found by review).
func (s *Store) writeStream(ctx context.Context, sku string, epoch int64, write func(context.Context, []inventory.Order, []inventory.IdempotencyRecord) error) error {
	from := "-"
	for {
		var (
			page *redis.XMessageSliceCmd
			wait *replicaWait
		)
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			page = p.XRangeN(ctx, s.keys(sku).orders, from, "+", 512)
			wait = s.awaitReadsReplicated(ctx, p)
			return nil
		})
		msgs, err := page.Result()
		if err != nil {
			return err
		}
		if err := s.confirmed(wait); err != nil {
			return errUnchecked{fmt.Errorf("the orders of %q in its stream: %w", sku, err)}
		}
		var orders []inventory.Order
		var keys []inventory.IdempotencyRecord
		for _, m := range msgs {
			r, err := decode(sku, m)
			if err != nil || !sameSale(r.epoch, epoch) {
				// Unreadable (logged by the consumer), or another sale's.
				// Every entry of this sale still in the stream is the
				// surviving history's, whatever renumbering it was taken
				// under (a check whose commit failed leaves such entries;
				// found by review).
				continue
			}
			orders = append(orders, r.order)
			if r.key.Key != "" {
				keys = append(keys, r.key)
			}
		}
		if len(orders) > 0 {
			if err := write(ctx, orders, keys); err != nil {
				return err
			}
		}
		if len(msgs) < 512 {
			return nil
		}
		from = "(" + msgs[len(msgs)-1].ID
	}
}
