package reservation

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flashsale/stock/internal/inventory"
)

// The relay: units the database gave back (a cancel, an expiry, a
// restock) reach the store that counts the stock in Redis.

// RelayKind is what a relay hands over: returned orders or restocks.
type RelayKind int

const (
	// Returns are orders the database moved out of held (cancelled,
	// expired): ID, UserID, Claimed and Quantity of each.
	Returns RelayKind = iota
	// Restocks are restocks of the sale: ID and Quantity of each.
	Restocks
)

// Marked is one SKU's orders or restocks marked for the relay, with the
// number of the sale they belong to.
type Marked struct {
	SKU   string
	Sale  int64
	Items []inventory.Order
}

// AddMarked appends o, marked for the relay in sale of its SKU, to marked:
// to the last SKU's items when it is o's, else as a new SKU. The engines'
// RelayMarked read the rows in SKU order and group them with it.
func AddMarked(marked []Marked, sale int64, o inventory.Order) []Marked {
	if len(marked) == 0 || marked[len(marked)-1].SKU != o.SKU {
		marked = append(marked, Marked{SKU: o.SKU, Sale: sale})
	}
	last := &marked[len(marked)-1]
	last.Items = append(last.Items, o)
	return marked
}

// TakenItems lists the items of the SKUs of marked that taken names (their
// marks are the ones to clear), and how many items marked holds in all.
func TakenItems(marked []Marked, taken []string) (items []inventory.Order, handed int) {
	for _, m := range marked {
		handed += len(m.Items)
		if slices.Contains(taken, m.SKU) {
			items = append(items, m.Items...)
		}
	}
	return items, handed
}

// relayBatch is how many returns one relay transaction hands over.
const relayBatch = 256

// RelayReturns is the strategy's RelayReturns: the returns the database
// made and marked (a cancel, an expiry: Tx.MarkRelay) go back to the store,
// and the restocks (Tx.RecordRestock) reach it, a batch at a time, until
// none of skus' is left (every SKU's when skus is empty). The store takes
// each order once per sale (Reservations.Return), so a batch handed over
// twice (two relays, a clearing lost) adds nothing. Returns of a sale the
// store no longer holds (restarted since, or lost with a wiped Redis,
// which fails closed until a new sale) have nowhere to go: their marks are
// cleared.
//
// The invariant: a unit comes back to the store only for an order the
// database moved out of held (the mark commits with that move), and once
// per order (the store's set). The schedule it forbids: a relay whose
// store call succeeded and whose clearing of the marks was lost runs
// again (or two relays read the same marks), and without the set the
// units would come back twice.
func (r *Reserved) RelayReturns(ctx context.Context, skus ...string) (int, error) {
	if len(skus) == 0 {
		return r.relayAll(ctx)
	}
	total := 0
	var errs []error
	for from := 0; from < len(skus); from += relayBatch {
		n, err := r.relaySKUs(ctx, skus[from:min(from+relayBatch, len(skus))])
		total += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	return total, errors.Join(errs...)
}

// relaySKUs relays the marked returns, then the restocks, of skus: a batch
// of every SKU's read by one statement, given back to the store by one
// pipeline and its marks cleared by one statement, until none is left. A
// SKU the store fails keeps its marks for the next relay and leaves this
// one, so that it holds up no other SKU's returns or restocks (found by
// review: a SKU whose returns kept failing kept every other SKU's restock
// out of Redis, and a failing SKU with a batch's worth of returns would
// have filled every read).
func (r *Reserved) relaySKUs(ctx context.Context, skus []string) (int, error) {
	total := 0
	var errs []error
	for _, kind := range []RelayKind{Returns, Restocks} {
		pending := slices.Clone(skus)
		for len(pending) > 0 {
			failed := map[string]bool{}
			n, err := r.db.RelayMarked(ctx, pending, kind, relayBatch, func(ctx context.Context, marked []Marked) ([]string, error) {
				var taken []string
				for i, err := range r.res.GiveBack(ctx, kind, marked) {
					if err == nil || errors.Is(err, inventory.ErrStaleSale) || errors.Is(err, ErrSaleNotLoaded) {
						taken = append(taken, marked[i].SKU)
					} else {
						failed[marked[i].SKU] = true
						errs = append(errs, fmt.Errorf("%q: %w", marked[i].SKU, err))
					}
				}
				return taken, nil
			})
			total += n
			if err != nil {
				return total, errors.Join(append(errs, err)...)
			}
			if n < relayBatch && len(failed) == 0 {
				break
			}
			pending = slices.DeleteFunc(pending, func(sku string) bool { return failed[sku] })
		}
	}
	return total, errors.Join(errs...)
}

// relayAll relays every SKU's marked returns and restocks, a page of SKUs
// at a time.
func (r *Reserved) relayAll(ctx context.Context) (int, error) {
	total := 0
	for {
		skus, err := r.db.SKUsRelaying(ctx, relayBatch)
		if err != nil || len(skus) == 0 {
			return total, err
		}
		n, err := r.relaySKUs(ctx, skus)
		total += n
		// A SKU that failed stays listed: stop rather than list it again.
		if err != nil || len(skus) < relayBatch {
			return total, err
		}
	}
}
