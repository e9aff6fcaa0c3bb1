package sales

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// The lifecycle's invariant, in one sentence: a unit comes back only in the
// transaction whose conditional UPDATE moved its order out of held, and an
// order leaves held once. The schedule it forbids: a cancel and the sweep
// (or a retried cancel, two sweepers, a lazy expiry racing the sweep) both
// read held and both return the unit, +1 twice. Returns leave the stock's
// version alone (Tx.ReturnUnits): they only add, so no strategy's read
// goes wrong through one, and a lock holder's fenced write is not refused
// because a buyer cancelled meanwhile.

// returnsUnits reports whether moving an order to state gives its units back.
func returnsUnits(state string) bool {
	return state == inventory.OrderCancelled || state == inventory.OrderExpired
}

// settleAttempts bounds how often one transition looks again after losing
// a race; each loss moves the order to a state that ends the loop, so more
// than one more look means something else is wrong.
const settleAttempts = 3

// PayOrder pays the held order id of buyer userID and returns it, paid. A
// repeated pay answers the paid order again. ErrOrderExpired when the hold
// lapsed first (by the database's clock; the units go back at once if no
// sweep returned them yet), ErrOrderCancelled after a cancel, ErrOrderFinal
// for an order placed without a hold, ErrOrderNotFound for an unknown id or
// another buyer's order.
func (s *Service) PayOrder(ctx context.Context, id, userID string) (inventory.Order, error) {
	return s.settle(ctx, id, userID, inventory.OrderPaid)
}

// CancelOrder cancels the held order id of buyer userID, gives its units
// back, and returns it, cancelled. A repeated cancel answers the cancelled
// order again. ErrOrderPaid after a pay, ErrOrderExpired when the hold
// lapsed first, ErrOrderFinal and ErrOrderNotFound as for PayOrder.
func (s *Service) CancelOrder(ctx context.Context, id, userID string) (inventory.Order, error) {
	return s.settle(ctx, id, userID, inventory.OrderCancelled)
}

func (s *Service) settle(ctx context.Context, id, userID, to string) (inventory.Order, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer cancel()
	for range settleAttempts {
		o, err := s.FindOrder(ctx, id, userID)
		if err != nil {
			return inventory.Order{}, err
		}
		if o.State != inventory.OrderHeld {
			return s.answerSettledReplicated(ctx, o, to)
		}
		moved, resolved, err := s.transition(ctx, o, to)
		if err != nil {
			return inventory.Order{}, err
		}
		if moved {
			o.State = to
			return o, nil
		}
		if resolved != nil {
			// A lost commit answer, resolved by reading the order: answer
			// from what it is now (the order's own time may be spent).
			return s.answerSettledReplicated(ctx, *resolved, to)
		}
		// Lost: another transition moved it first, or the hold lapsed
		// (the database said so by refusing); the next look answers.
	}
	return inventory.Order{}, fmt.Errorf("%w: order %s kept changing under %d attempts to mark it %s", inventory.ErrBusy, id, settleAttempts, to)
}

// answerSettledReplicated is answerSettled once the order's state is on
// the store's standbys, when the answer is the state asked for: read, not
// committed by this call, it may be a commit whose wait for them was cut
// short (found by review: a pay so answered "paid" was held again after a
// failover, its unit resold).
func (s *Service) answerSettledReplicated(ctx context.Context, o inventory.Order, want string) (inventory.Order, error) {
	if o.State == want {
		if err := s.awaitReplicated(ctx, o.ID, o.SKU); err != nil {
			return inventory.Order{}, err
		}
	}
	return answerSettled(o, want)
}

// answerSettled answers a transition to want of an order no longer held:
// the same state again is the idempotent repeat, any other says who won.
func answerSettled(o inventory.Order, want string) (inventory.Order, error) {
	if o.State == want {
		return o, nil
	}
	switch o.State {
	case inventory.OrderPaid:
		return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderPaid, o.ID)
	case inventory.OrderCancelled:
		return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderCancelled, o.ID)
	case inventory.OrderExpired:
		return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderExpired, o.ID)
	case inventory.OrderFinal:
		return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderFinal, o.ID)
	}
	return inventory.Order{}, fmt.Errorf("order %s is in state %q, which this version does not know", o.ID, o.State)
}

// transition runs one conditional move of o out of held, with the return of
// its units in the same transaction when to gives them back, and reports
// whether this call moved it. A commit whose answer was lost is resolved by
// reading the order: the move and the return committed together or not at
// all, so the state tells which, and resolved is the order as read.
func (s *Service) transition(ctx context.Context, o inventory.Order, to string) (moved bool, resolved *inventory.Order, err error) {
	for attempt := 0; attempt < s.txAttempts; attempt++ {
		moved, err = s.settleTx(ctx, o, to)
		switch {
		case err == nil:
			s.settled(ctx, o, to, moved)
			return moved, nil, nil
		case errors.Is(err, inventory.ErrOutcomeUnknown):
			return s.resolveSettle(ctx, o, to, err)
		case errors.Is(err, inventory.ErrConflict):
			s.obs.Retried(s.strategy.Name, "conflict")
			if perr := inventory.Pause(ctx, backoff.Exponential(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
				return false, nil, perr
			}
		default:
			return false, nil, s.classify(ctx, err)
		}
	}
	return false, nil, fmt.Errorf("%w: transaction aborted %d times: %w", inventory.ErrBusy, s.txAttempts, err)
}

// settleTx is one transaction of a transition: the conditional move, and
// the return of the units when it moved the order out of held.
func (s *Service) settleTx(ctx context.Context, o inventory.Order, to string) (moved bool, err error) {
	err = s.store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		var terr error
		moved, terr = tx.SettleOrder(ctx, o.ID, o.UserID, to)
		if terr != nil || !moved || !returnsUnits(to) {
			return terr
		}
		// Order, buyer, stock: the order of the locks every transaction
		// of the lifecycle takes. The buyer's count gets back what the
		// order claimed on it, nothing when it claimed nothing (taken
		// without a limit).
		if o.Claimed > 0 {
			if terr = tx.ReleaseUnits(ctx, o.SKU, o.UserID, o.Claimed); terr != nil {
				return terr
			}
		}
		if terr = tx.ReturnUnits(ctx, o.SKU, o.Quantity); terr != nil || s.relay == nil {
			return terr
		}
		return tx.MarkRelay(ctx, []string{o.ID})
	})
	if err != nil {
		moved = false
	}
	return moved, err
}

// settled counts a committed move and relays its return.
func (s *Service) settled(ctx context.Context, o inventory.Order, to string, moved bool) {
	if !moved {
		return
	}
	s.obs.OrderSettled(s.strategy.Name, to)
	if returnsUnits(to) {
		s.unitsBack(ctx, o.SKU)
	}
}

// resolveSettle answers a transition whose commit answer was lost
// (unknown). Its COMMIT may still be landing on the server: a plain read
// now can see the order held and the move land a moment later (found by
// TestCancelWhoseCommitAnswerIsLostAtTheDeadlineIsResolved, under load).
// So the transition runs once more, with time of its own (the commit's
// answer is often lost to the deadline itself): its conditional UPDATE
// waits for the first transaction's row lock, then finds the order moved
// (the first committed) or moves it itself (it did not); either way the
// state read afterwards answers, and the units came back once.
func (s *Service) resolveSettle(ctx context.Context, o inventory.Order, to string, lost error) (bool, *inventory.Order, error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	moved, err := s.settleTx(lctx, o, to)
	if err != nil {
		return false, nil, lost
	}
	if moved {
		s.settled(lctx, o, to, true)
		return true, nil, nil
	}
	now, found, err := s.store.FindOrder(lctx, o.ID)
	if err != nil || !found || now.State == inventory.OrderHeld {
		return false, nil, lost
	}
	if now.State == to {
		// Most likely the first commit, whose answer was lost: its
		// units are back, so relay them and lift this instance's mark
		// as a move answered in time would (found by review:
		// TestSoldOutMarkIsClearedByACancelWhoseCommitAnswerWasLost).
		// If another transaction made the same move, the relay finds
		// nothing more to do and the mark only asks the store sooner.
		s.settled(lctx, o, to, true)
	}
	return false, &now, nil
}

// expireIfLapsed is the lazy expiry: a held order that is read is expired
// on the spot when its hold had lapsed by the database's clock at the read
// (and the statement checks it again), so its buyer never sees a hold that
// can no longer be paid, and its units go back without waiting for the
// sweep. A hold that runs on costs the read only.
func (s *Service) expireIfLapsed(ctx context.Context, o inventory.Order) (inventory.Order, error) {
	if o.State != inventory.OrderHeld || !o.Lapsed {
		return o, nil
	}
	moved, resolved, err := s.transition(ctx, o, inventory.OrderExpired)
	if err != nil {
		return inventory.Order{}, err
	}
	if resolved != nil {
		return *resolved, nil
	}
	if !moved {
		// Not lapsed, or another expiry, pay or cancel came first: read
		// what it is now.
		now, found, err := s.store.FindOrder(ctx, o.ID)
		if err != nil {
			return inventory.Order{}, err
		}
		if !found {
			return inventory.Order{}, fmt.Errorf("%w: %s", inventory.ErrOrderNotFound, o.ID)
		}
		return now, nil
	}
	o.State = inventory.OrderExpired
	return o, nil
}

// DefaultSweepBatch is how many lapsed holds one sweep transaction expires:
// enough that a sweep of thousands takes few transactions, few enough that
// one holds the stock rows of at most that many SKUs, briefly.
const DefaultSweepBatch = 200

// ExpireHolds is the sweep: it expires lapsed holds, batch orders a
// transaction (at most; rows another transaction holds are skipped and
// left to it), each batch's units returned in its own transaction, until
// none is left or ctx ends. It returns how many orders it expired. Two
// sweepers at once take disjoint orders, and an order a pay or cancel is
// moving meanwhile is left to that transition.
func (s *Service) ExpireHolds(ctx context.Context, batch int) (int, error) {
	if batch <= 0 {
		batch = DefaultSweepBatch
	}
	total := 0
	for {
		var expired []inventory.Order
		err := s.store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
			var err error
			expired, err = tx.ExpireLapsed(ctx, batch)
			if err != nil {
				return err
			}
			// The buyers' rows, then the SKUs' stock rows, each by one
			// statement whatever the SKUs, each taking its rows in order
			// (buyers by SKU and buyer, stock by SKU): two sweepers that
			// took orders of the same SKUs lock the rows in the same order
			// and cannot deadlock, and a batch is a few round trips, not a
			// few per SKU (a batch of one round trip per buyer did not
			// commit within a 50 ms run on a loaded MariaDB,
			// TestKillMidSweep, and a run cut short commits nothing; one
			// per SKU made a sweep over a catalog cost several times a
			// sweep of one hot SKU's holds: BenchmarkSweep).
			if err := tx.ReleaseEach(ctx, claimsOf(expired)); err != nil {
				return err
			}
			if err := tx.ReturnEach(ctx, unitsBySKU(expired)); err != nil {
				return err
			}
			if s.relay == nil || len(expired) == 0 {
				return nil
			}
			ids := make([]string, len(expired))
			for i, o := range expired {
				ids[i] = o.ID
			}
			return tx.MarkRelay(ctx, ids)
		})
		if err != nil {
			// A lost commit answer is not retried here: the next sweep
			// finds whatever is still held, and what committed moved its
			// orders and their units together.
			return total, fmt.Errorf("sweep: %w", s.classify(ctx, err))
		}
		total += len(expired)
		for range expired {
			s.obs.OrderSettled(s.strategy.Name, inventory.OrderExpired)
		}
		s.unitsBack(ctx, skusOf(expired)...)
		if len(expired) < batch {
			// And what a process that died after its commit, or a relay
			// that failed, left marked: within the sweep's own time. The
			// expiries committed; a store that does not answer only
			// delays these (they stay marked for the next sweep), so it
			// is a warning, not a failed sweep.
			if s.relay != nil {
				if _, err := s.relay(ctx); err != nil {
					s.log.Warn("returns left marked not yet given back to the strategy's store: the next sweep tries again",
						"strategy", s.strategy.Name, "err", err)
				}
			}
			return total, nil
		}
		if ctx.Err() != nil {
			return total, context.Cause(ctx)
		}
	}
}

// unitsBack follows a commit that gave units back to the SKUs' sales (a
// return, a restock, a sweep's batch): it relays them to the strategy's
// own store, every SKU's at once, then lifts this instance's sold-out
// marks, so that its next order asks the store that now has them.
func (s *Service) unitsBack(ctx context.Context, skus ...string) {
	s.relayReturns(ctx, skus...)
	for _, sku := range skus {
		s.soldOut.clear(sku)
	}
}

// relayWait bounds the relay that follows a commit: the buyer's answer
// waits for it, and a store that does not answer only delays the units
// (they stay marked for the sweep).
const relayWait = time.Second

// relayReturns gives the SKUs' returns just committed back to the
// strategy's own store, when it counts the stock outside the database, so
// that they are on sale again when the buyer hears the answer. A failure
// only delays them: they stay marked, and the sweep relays them later; the
// answer is the database's.
func (s *Service) relayReturns(ctx context.Context, skus ...string) {
	if s.relay == nil || len(skus) == 0 {
		return
	}
	// Not bounded by a caller's deadline that may be spent.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.timeout, relayWait))
	defer cancel()
	if _, err := s.relay(ctx, skus...); err != nil {
		s.log.Warn("returned units not yet given back to the strategy's store: they stay marked, and the sweep relays them",
			"skus", len(skus), "first", skus[0], "strategy", s.strategy.Name, "err", err)
	}
}

// claimsOf sums what the orders claimed on their buyers' counts, per SKU
// and buyer, in that order (orders that claimed nothing are left out).
func claimsOf(orders []inventory.Order) []inventory.Order {
	var claimed []inventory.Order
	for _, o := range orders {
		if o.Claimed > 0 {
			o.Quantity = o.Claimed
			claimed = append(claimed, o)
		}
	}
	return sumUnits(claimed, true)
}

// skusOf lists the orders' SKUs, each once, in order.
func skusOf(orders []inventory.Order) []string {
	skus := make([]string, 0, len(orders))
	for _, r := range unitsBySKU(orders) {
		skus = append(skus, r.SKU)
	}
	return skus
}

// unitsBySKU sums the orders' quantities per SKU, in order.
func unitsBySKU(orders []inventory.Order) []inventory.Order { return sumUnits(orders, false) }

func sumUnits(orders []inventory.Order, byBuyer bool) []inventory.Order {
	type key struct{ sku, user string }
	sum := map[key]int64{}
	for _, o := range orders {
		k := key{sku: o.SKU}
		if byBuyer {
			k.user = o.UserID
		}
		sum[k] += o.Quantity
	}
	out := make([]inventory.Order, 0, len(sum))
	for k, q := range sum {
		out = append(out, inventory.Order{SKU: k.sku, UserID: k.user, Quantity: q})
	}
	slices.SortFunc(out, func(a, b inventory.Order) int {
		return cmp.Or(cmp.Compare(a.SKU, b.SKU), cmp.Compare(a.UserID, b.UserID))
	})
	return out
}
