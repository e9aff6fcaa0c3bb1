package batched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/flashsale/stock/internal/inventory"
)

// skuPart is the orders of one SKU in a batch, in arrival order, each
// with its index in the batch, and what the batch decided for them.
type skuPart struct {
	sku       string
	idx       []int
	orders    []*batchOrder
	limit     int64
	held      map[string]int64
	plan      []decision
	total     int64
	claims    map[string]int64
	windowErr error
	// rowHeld: another transaction held the SKU's row, and the batch
	// skipped it (decideBatch's skipHeld): nothing is decided for its
	// orders.
	rowHeld bool
}

// partsOf splits a batch by SKU, in SKU order (byte order): the order in
// which the batch takes the SKUs' rows, so two batches that share SKUs
// queue on the first they share instead of deadlocking.
func partsOf(batch []*batchOrder) []*skuPart {
	bySKU := map[string]*skuPart{}
	var parts []*skuPart
	for i, o := range batch {
		p := bySKU[o.sku]
		if p == nil {
			p = &skuPart{sku: o.sku}
			bySKU[o.sku] = p
			parts = append(parts, p)
		}
		p.idx, p.orders = append(p.idx, i), append(p.orders, o)
	}
	slices.SortFunc(parts, func(a, b *skuPart) int { return strings.Compare(a.sku, b.sku) })
	return parts
}

// unknownSKU is the error of a batch one of whose SKUs has no stock row:
// the transaction is rolled back, that SKU's orders are answered
// ErrUnknownSKU and the others run again without them, so an order for a
// SKU that does not exist never fails another SKU's. It never leaves the
// package.
type unknownSKU struct {
	skus []string
	err  error // the first SKU's
}

func (u unknownSKU) Error() string { return fmt.Sprintf("unknown skus %q: %v", u.skus, u.err) }

// with adds sku, which has no row (err says so), to u.
func (u unknownSKU) with(sku string, err error) unknownSKU {
	if u.err == nil {
		u.err = err
	}
	u.skus = append(u.skus, sku)
	return u
}
func (u unknownSKU) Unwrap() error { return u.err }

// decideBatch is the batch's transaction, whatever SKUs its orders are
// of: it reads the records of the batch's keys; claims the buyers' units
// of every SKU, SKU by SKU, before any stock row (as the sweep and every
// transaction of the lifecycle take them: buyers, then stock); decides
// each SKU's orders in arrival order (planBatch) and deducts each SKU's
// total with one conditional UPDATE, SKU by SKU in SKU order (or, when
// that cannot cover them all, decides that SKU again under its row lock
// with what is left); and inserts every accepted order and idempotency
// record with one multi-row INSERT each. It fills results and returns one
// created order, the zero Order when it wrote none.
//
// The invariant, per SKU as for a batch of one SKU: a SKU's accepted
// total is deducted by one conditional UPDATE (or under its row lock, in
// arrival order while each order fits), so no schedule takes more than
// is there. The SKUs of one batch are one transaction: they commit
// together or not at all.
//
// With skipHeld (a lane's batch), the stock rows another transaction
// holds are skipped, not waited for: their SKUs' orders are answered
// errRowHeld, with nothing decided and their buyers' claims given back.
func decideBatch(ctx context.Context, tx Tx, batch []*batchOrder, results []batchResult, skipHeld bool) (inventory.Order, error) {
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
			return inventory.Order{}, err
		}
	}
	parts := partsOf(batch)
	// The buyers' units are claimed before the stock rows are touched,
	// and before the deduction, as if every order fit: the stock row is
	// each SKU's serial section (every batch of the SKU waits for it),
	// and only what must should run under it. When the stock then cannot
	// cover a SKU's plan, the claims of the orders refused are given back
	// under the row lock, in one statement.
	for _, p := range parts {
		var err error
		if p.limit, p.held, err = claimBuyers(ctx, tx, p.orders, known); err != nil {
			return inventory.Order{}, err
		}
		p.plan, p.total = planBatch(p.orders, known, math.MaxInt64, p.limit, p.held)
		p.claims = claimsOf(p.orders, p.plan, p.limit)
	}
	if err := deductParts(ctx, tx, parts, known, skipHeld); err != nil {
		return inventory.Order{}, err
	}

	var orders []inventory.Order
	var taken []int // the index in batch of each of orders
	var records []inventory.IdempotencyRecord
	priors := map[string]inventory.Order{} // by key
	for _, p := range parts {
		if p.rowHeld {
			for _, i := range p.idx {
				results[i].err = errRowHeld
			}
			continue
		}
		for j, o := range p.orders {
			i := p.idx[j]
			switch d := p.plan[j]; d.verdict {
			case accepted:
				order := o.order
				if p.limit > 0 {
					// Claimed on the buyer's count above; its cancel
					// or expiry gives back this much.
					order.Claimed = order.Quantity
				}
				orders, taken = append(orders, order), append(taken, i)
				results[i].order = order
				if o.key != "" {
					records = append(records, inventory.IdempotencyRecord{Key: o.key, SKU: p.sku, RequestHash: o.fingerprint, OrderID: o.order.ID})
				}
			case soldOut:
				results[i].err = inventory.ErrSoldOut
				if p.windowErr != nil {
					results[i].err = p.windowErr
				}
			case limitReached:
				results[i].err = fmt.Errorf("%w: %q may hold or have paid for at most %d units of %q in this sale",
					inventory.ErrLimitReached, o.order.UserID, p.limit, p.sku)
			case conflicting:
				results[i].err = fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, o.key)
			case follows:
				results[i] = results[p.idx[d.of]] // d.of < j: decided already
			case replays:
				prior, ok := priors[o.key]
				if !ok {
					var err error
					if prior, err = tx.GetOrder(ctx, known[o.key].OrderID); err != nil {
						return inventory.Order{}, err
					}
					priors[o.key] = prior
				}
				results[i].order = prior
			}
		}
	}
	if len(orders) == 0 {
		return inventory.Order{}, nil
	}
	expiries, err := tx.InsertOrders(ctx, orders)
	if err != nil {
		return inventory.Order{}, err
	}
	for j, i := range taken {
		results[i].order.ExpiresAt = expiries[j]
	}
	for _, p := range parts {
		for j, d := range p.plan {
			if d.verdict == follows && !p.rowHeld {
				// Set above before the expiries were known.
				results[p.idx[j]] = results[p.idx[d.of]]
			}
		}
	}
	if len(records) > 0 {
		// In key order, so two batches that share keys never wait for
		// each other's in opposite orders.
		slices.SortFunc(records, func(a, b inventory.IdempotencyRecord) int { return strings.Compare(a.Key, b.Key) })
		n, err := tx.InsertIdempotencyRecords(ctx, records)
		if err != nil {
			return inventory.Order{}, err
		}
		if n < len(records) {
			return inventory.Order{}, fmt.Errorf("%w: %d of %d keys of the batch", errKeyTaken, len(records)-n, len(records))
		}
	}
	return orders[0], nil
}

// deductParts deducts each part's total: one conditional UPDATE for a
// batch of one SKU, one statement for every SKU of a batch of several
// (DeductEach, the rows locked in SKU order), or, with skipHeld, one
// statement that skips the rows other transactions hold
// (DeductEachSkippingHeld), whose parts are marked rowHeld and their
// claims given back. A SKU its stock cannot cover is then planned again
// from its row as read under its lock (that statement's, or LockLevel's
// for a batch of one SKU), and what that plan accepts is deducted by one
// more statement for them all.
func deductParts(ctx context.Context, tx Tx, parts []*skuPart, known map[string]inventory.IdempotencyRecord, skipHeld bool) error {
	var skus []string
	var totals []int64
	var want []*skuPart
	for _, p := range parts {
		if p.total > 0 {
			skus, totals, want = append(skus, p.sku), append(totals, p.total), append(want, p)
		}
	}
	var done []Deduction
	var err error
	// A level comes back with every row, except from the conditional
	// UPDATE of one SKU.
	levels := true
	switch {
	case len(want) == 0:
		return nil
	case skipHeld:
		done, err = tx.DeductEachSkippingHeld(ctx, skus, totals)
	case len(want) == 1:
		var ok bool
		ok, err = tx.DeductIfAvailable(ctx, skus[0], totals[0])
		done, levels = []Deduction{{Deducted: ok}}, false
	default:
		done, err = tx.DeductEach(ctx, skus, totals)
	}
	if err != nil {
		return err
	}
	// Every SKU without a row is found in this pass, so that the batch
	// runs again once without all of them (found by review: one at a
	// time, a batch of 256 orders for missing SKUs took 256
	// transactions).
	var unknown unknownSKU
	var again []*skuPart
	for i, p := range want {
		d := done[i]
		if d.Deducted {
			continue
		}
		if d.Held {
			p.rowHeld = true
			if len(p.claims) > 0 {
				if err := tx.ReleaseUnitsOf(ctx, p.sku, p.claims); err != nil {
					return err
				}
			}
			continue
		}
		if !levels {
			level, err := tx.LockLevel(ctx, p.sku)
			switch {
			case errors.Is(err, inventory.ErrUnknownSKU):
				unknown = unknown.with(p.sku, err)
				continue
			case err != nil:
				return err
			}
			d = Deduction{Exists: true, Level: level}
		}
		if !d.Exists {
			unknown = unknown.with(p.sku, fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, p.sku))
			continue
		}
		if err := replan(ctx, tx, p, d.Level, known); err != nil {
			return err
		}
		if p.total > 0 {
			again = append(again, p)
		}
	}
	if len(unknown.skus) > 0 {
		return unknown
	}
	return deductReplanned(ctx, tx, again)
}

// replan plans p again with its row's level, read under its lock: what
// is left (nothing, with its window's refusal for every order, when the
// sale is not open), giving back the claims of the orders refused.
func replan(ctx context.Context, tx Tx, p *skuPart, level inventory.Level, known map[string]inventory.IdempotencyRecord) error {
	available := level.Available
	if p.windowErr = level.Refusal(0); p.windowErr != nil {
		available = 0
	}
	p.plan, p.total = planBatch(p.orders, known, available, p.limit, p.held)
	if unclaimed := surplus(p.claims, claimsOf(p.orders, p.plan, p.limit)); len(unclaimed) > 0 {
		return tx.ReleaseUnitsOf(ctx, p.sku, unclaimed)
	}
	return nil
}

// deductReplanned deducts the totals of the parts planned again under
// their row locks (in SKU order, as parts are): each fits what its row
// held, so only the clock refuses one (its window ended between the read
// and the write); then nothing is committed, and the batch runs again and
// reads it shut (found by review: a plain error here failed every SKU of
// the batch with a 503).
func deductReplanned(ctx context.Context, tx Tx, parts []*skuPart) error {
	refused := func(p *skuPart) error {
		return fmt.Errorf("%w: %q's deduction of %d, planned under its row lock, was refused (its window ended meanwhile)", inventory.ErrConflict, p.sku, p.total)
	}
	switch len(parts) {
	case 0:
		return nil
	case 1:
		ok, err := tx.DeductIfAvailable(ctx, parts[0].sku, parts[0].total)
		if err == nil && !ok {
			err = refused(parts[0])
		}
		return err
	}
	skus, totals := make([]string, len(parts)), make([]int64, len(parts))
	for i, p := range parts {
		skus[i], totals[i] = p.sku, p.total
	}
	done, err := tx.DeductEach(ctx, skus, totals)
	if err != nil {
		return err
	}
	for i, d := range done {
		if !d.Deducted {
			return refused(parts[i])
		}
	}
	return nil
}

// sharedKeyLater splits a batch's orders (indices into batch) into those
// that run now and those whose idempotency key an earlier order of
// another SKU in the batch has: a key names one request, and a SKU is
// part of it, so the later order is decided after the earlier one
// committed (it replays nothing and conflicts, or is a fresh request if
// the earlier one was refused), as if it had come in a batch of its own.
func sharedKeyLater(batch []*batchOrder, orders []int) (now, later []int) {
	skuOfKey := map[string]string{}
	deferred := map[string]bool{} // SKUs with an order deferred: the rest follow it
	for _, i := range orders {
		o := batch[i]
		if deferred[o.sku] {
			later = append(later, i)
			continue
		}
		if o.key != "" {
			if sku, ok := skuOfKey[o.key]; ok && sku != o.sku {
				// Every later order of its SKU waits too, so that the
				// SKU's orders are still decided in arrival order (found
				// by review: a keyless order after it took its unit).
				deferred[o.sku] = true
				later = append(later, i)
				continue
			}
			skuOfKey[o.key] = o.sku
		}
		now = append(now, i)
	}
	return now, later
}
