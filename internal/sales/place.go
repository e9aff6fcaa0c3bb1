package sales

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// Errors that steer the transaction runner; they never leave the package.
var (
	// errReplayed: the idempotency key has an order already.
	errReplayed = errors.New("idempotency key already answered")
	// errKeyTaken: a concurrent request with the same key committed first;
	// the next attempt finds its record and replays it.
	errKeyTaken = errors.New("idempotency key taken concurrently")
)

// PlaceOrder deducts req.Quantity units of req.SKU and records the order. With
// an idempotency key, a retry of the same request returns the first order and
// deducts nothing more; the same key with another request is
// ErrIdempotencyConflict.
func (s *Service) PlaceOrder(ctx context.Context, req inventory.Request) (inventory.Order, error) {
	began := time.Now()
	order, err := s.placeOrder(ctx, req)
	s.obs.OrderDone(s.strategy.Name, inventory.Outcome(err), time.Since(began))
	return order, err
}

func (s *Service) placeOrder(ctx context.Context, req inventory.Request) (inventory.Order, error) {
	if err := req.Validate(); err != nil {
		return inventory.Order{}, err
	}
	if s.limit > 0 && req.Quantity > s.limit {
		// No transaction: no order of this size can ever be taken (and
		// the answer says so, not sold out).
		return inventory.Order{}, s.limitReached(req)
	}
	// The order's work goes through one node of a cluster whose every
	// node takes writes (inventory.WithAffinity).
	ctx = inventory.WithAffinity(ctx, req.SKU)
	sent := s.now()
	refused, probe := s.markAdmits(req)
	if probe != 0 {
		// Let through to renew the mark ahead of its end: its refusal
		// is noted below, and whatever its answer, the next order may
		// probe again.
		defer s.soldOut.probed(req.SKU, probe)
	}
	// The order runs to its own deadline even if the client hangs up: the
	// transaction is atomic either way, and finishing it keeps the logs and
	// the answer for a retry true. Set here only when the buyer's units
	// are read first, so that the read and the order share it.
	deadlineSet := false
	if refused && s.limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
		deadlineSet = true
		// The buyer's units decide between the mark's answer and the
		// limit's; unread, the store answers.
		if err := s.refusalAtMark(ctx, req); err != nil {
			return inventory.Order{}, err
		}
		refused = false
	}
	if refused {
		// Refused sold out a moment ago: refused again without asking.
		// Not with a key: a retry of an order that was taken must get its
		// order back, and only the strategy knows where the key is (the
		// reservation strategies' reach the database later). Before the
		// deadline's timer and the fingerprint: the answer given most in a
		// flash sale costs neither.
		return inventory.Order{}, s.soldOutError(req)
	}
	// Only a key's replay compares fingerprints: an order without one
	// (most of a flash sale's) skips the hash.
	var fingerprint []byte
	if req.IdempotencyKey != "" {
		fingerprint = req.Fingerprint()
	}

	if !deadlineSet {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		defer cancel()
	}

	order := inventory.Order{
		ID:       s.newID(),
		SKU:      req.SKU,
		Quantity: req.Quantity,
		UserID:   req.UserID,
		Strategy: s.strategy.Name,
		State:    inventory.OrderFinal,
	}
	if s.hold > 0 {
		order.State, order.Hold = inventory.OrderHeld, s.hold
	}
	if s.limit > 0 {
		// Claimed on the buyer's count in the order's transaction
		// (ClaimUnits), and given back by its cancel or expiry.
		order.Claimed = order.Quantity
	}
	var replayed inventory.Order
	var err error
	if take := s.strategy.TakeOrder; take != nil {
		// The strategy owns the transaction (batched.Batched): it checks
		// the key, deducts, and records the order and its key itself.
		placed, terr := take(ctx, inventory.PendingOrder{Order: order, IdempotencyKey: req.IdempotencyKey, Fingerprint: fingerprint, PerUserLimit: s.limit,
			Mark: s.markFor(req, probe != 0)})
		if terr == nil && placed.ID != order.ID {
			replayed, terr = placed, errReplayed
		}
		order.ExpiresAt = placed.ExpiresAt
		err = terr
	} else {
		replayed, err = s.deduct(ctx, req, &order, fingerprint, probe != 0)
	}
	switch {
	case err == nil:
		// Guarded: slog boxes its arguments before it asks the level.
		if s.log.Enabled(ctx, slog.LevelDebug) {
			s.log.Debug("order created", "order_id", order.ID, "sku", order.SKU, "quantity", order.Quantity, "strategy", order.Strategy)
		}
		return order, nil
	case errors.Is(err, errReplayed):
		s.log.Debug("order replayed", "order_id", replayed.ID, "sku", replayed.SKU, "idempotency_key", req.IdempotencyKey)
		if err := s.awaitReplicated(ctx, replayed.ID, replayed.SKU); err != nil {
			return inventory.Order{}, err
		}
		return s.asStored(ctx, replayed), nil
	}
	err = s.classify(ctx, err)
	if errors.Is(err, inventory.ErrSoldOut) && !errors.Is(err, errSoldOutByMark) {
		// Only the store's refusals mark: a mark's own refusal noted
		// again would stretch it past the observation it stands for.
		s.soldOut.note(req.SKU, req.Quantity, sent)
	}
	if req.IdempotencyKey != "" && (errors.Is(err, inventory.ErrSoldOut) || errors.Is(err, inventory.ErrBusy) || errors.Is(err, inventory.ErrLimitReached)) {
		if prior, ok := s.replayAfterRefusal(ctx, req.IdempotencyKey, fingerprint); ok {
			if err := s.awaitReplicated(ctx, prior.ID, prior.SKU); err != nil {
				return inventory.Order{}, err
			}
			return prior, nil
		}
	}
	if errors.Is(err, inventory.ErrSoldOut) {
		return inventory.Order{}, s.soldOutError(req)
	}
	if !refusal(err) {
		s.log.Warn("order failed", "sku", req.SKU, "order_id", order.ID, "strategy", s.strategy.Name, "err", err)
	}
	return inventory.Order{}, err
}

// asStored is a replayed order as the database has it now, when the
// strategy answered the replay from its own store (the reservation
// strategies know only the first order's id): its state (paid, cancelled,
// expired) and its expiry, as GET /orders/{id} would answer it (found by
// review: a paid order's replay answered "held", without expires_at). An
// order not written yet, or a lookup that fails, leaves the answer as the
// strategy gave it.
func (s *Service) asStored(ctx context.Context, replayed inventory.Order) inventory.Order {
	if s.relay == nil {
		return replayed
	}
	// One lookup, no wait: a replay comes after its first answer, and an
	// order still on its way to the database is answered as taken.
	o, found, err := s.store.FindOrder(ctx, replayed.ID)
	if err != nil || !found || o.UserID != replayed.UserID {
		return replayed
	}
	if o, err = s.expireIfLapsed(ctx, o); err != nil {
		return replayed
	}
	return o
}

// refusal reports whether err is an answer about the order itself (sold
// out, past the limit, outside the window, an unknown SKU, a reused key),
// not a failure worth a warning.
func refusal(err error) bool {
	for _, r := range []error{inventory.ErrSoldOut, inventory.ErrLimitReached, inventory.ErrSaleNotStarted, inventory.ErrSaleEnded, inventory.ErrUnknownSKU, inventory.ErrIdempotencyConflict} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// deduct takes the order through the strategy's Deduct, in the service's
// transaction (inTx); errReplayed with the prior order when the key was
// taken. A probe (markAdmits) is not refused by the mark it renews. A
// method of its own so that the closure and what it captures are
// allocated only on this path, not for a strategy that takes whole orders.
func (s *Service) deduct(ctx context.Context, req inventory.Request, order *inventory.Order, fingerprint []byte, probe bool) (inventory.Order, error) {
	var replayed inventory.Order
	inTx := func(ctx context.Context, deduct func(context.Context, inventory.StockTx) error) error {
		if !probe && s.markAnswers(req) {
			// The same check as on the way in, at the last moment before
			// the transaction: an order that waited its turn (the row's
			// gate, the lock, a retry's pause) while another order of this
			// instance was refused sold out is refused without a round
			// trip too. Without it the orders queued when a sale sells
			// out (up to ROW_MAX_IN_FLIGHT's waiters, every lock waiter)
			// each take the row in turn only to find it empty, and the
			// sold-out answers are the slowest of the burst.
			return errSoldOutByMark
		}
		err := s.runTx(ctx, *order, func(ctx context.Context, tx inventory.Tx) error {
			if req.IdempotencyKey != "" {
				prior, err := s.lookupKey(ctx, tx, req.IdempotencyKey, fingerprint)
				if err != nil {
					return err
				}
				if prior != nil {
					replayed = *prior
					return errReplayed
				}
			}
			// The buyer's row before the stock row: a cancel or an expiry
			// takes them in that order too (order, buyer, stock), so the
			// two never wait for each other in opposite orders.
			if s.limit > 0 {
				ok, err := tx.ClaimUnits(ctx, req.SKU, req.UserID, req.Quantity, s.limit)
				if err != nil {
					return err
				}
				if !ok {
					return s.limitReached(req)
				}
			}
			if err := deduct(ctx, tx); err != nil {
				return err
			}
			expires, err := tx.InsertOrder(ctx, *order)
			if err != nil {
				return err
			}
			order.ExpiresAt = expires
			if req.IdempotencyKey == "" {
				return nil
			}
			inserted, err := tx.InsertIdempotency(ctx, inventory.IdempotencyRecord{
				Key: req.IdempotencyKey, SKU: req.SKU, RequestHash: fingerprint, OrderID: order.ID,
			})
			if err != nil {
				return err
			}
			if !inserted {
				return errKeyTaken
			}
			return nil
		})
		switch {
		case errors.Is(err, inventory.ErrVersionMoved):
			s.obs.Retried(s.strategy.Name, "version_moved")
		case errors.Is(err, inventory.ErrFencedOff):
			s.obs.FencedOff(s.strategy.Name)
		}
		return err
	}

	// Not in one return statement: inTx sets replayed, and Go does not
	// order reading a variable against a call in the same expression list.
	err := s.strategy.Deduct(ctx, req.SKU, req.Quantity, inTx)
	return replayed, err
}

// lookupKey returns the order a key created before, nil if it has none, or
// ErrIdempotencyConflict when the key was used for another request.
func (s *Service) lookupKey(ctx context.Context, tx inventory.Tx, key string, fingerprint []byte) (*inventory.Order, error) {
	rec, found, err := tx.FindIdempotency(ctx, key)
	if err != nil || !found {
		return nil, err
	}
	if !bytes.Equal(rec.RequestHash, fingerprint) {
		return nil, fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, key)
	}
	o, err := tx.GetOrder(ctx, rec.OrderID)
	if err != nil {
		return nil, err
	}
	return &o, nil
}

// replicationAwaiter is a store whose commits wait for standbys
// (internal/postgres, under synchronous replication): a replay answers
// from a read, and waits for them through these first.
type replicationAwaiter interface {
	AwaitOrderReplicated(ctx context.Context, orderID string) error
	AwaitSaleReplicated(ctx context.Context, sku string) error
}

// awaitBudget bounds a replay's wait for the standbys: time of its own, as
// replayAfterRefusal's lookup has, since the request's may be spent by
// the refusal that led to the replay.
const awaitBudget = 2 * time.Second

// awaitReplicated returns once what a replay is about to answer (an order,
// or with orderID "" the SKU's sale) is on the store's standbys, when it
// has any: a read waits for no standby, while a commit whose wait for them
// was ended is visible before they have it, and answered so it could be
// lost with the primary. Not confirmed, it is a 503 that may have
// happened (inventory.ErrOutcomeUnknown), never "busy", which would say
// nothing was taken: the cause is kept as text only (found by review: a
// lock timeout wrapped in would have made it busy).
func (s *Service) awaitReplicated(ctx context.Context, orderID, sku string) error {
	r, ok := s.store.(replicationAwaiter)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), awaitBudget)
	defer cancel()
	var err error
	what := "order " + orderID
	if orderID != "" {
		err = r.AwaitOrderReplicated(ctx, orderID)
	} else {
		what = "the sale of " + sku
		err = r.AwaitSaleReplicated(ctx, sku)
	}
	if err != nil {
		return fmt.Errorf("%w: %s is on the primary, and its standby did not confirm it: %v", inventory.ErrOutcomeUnknown, what, err)
	}
	return nil
}

// replayAfterRefusal looks the key up again, in a transaction of its own,
// before a request with a key is refused. An earlier attempt of the same
// request may have committed after this one looked: its COMMIT was in flight
// when the client gave up and retried (the retry's write then waited on its
// row lock and found the stock gone), or it was a newer lock holder that
// fenced this one off. Refusing would tell the client "sold out" or "busy"
// for a request that succeeded; the exploration of every schedule of a
// request and its retry found both (internal/explore). Only refused requests
// with a key pay for the extra read. A lookup that fails keeps the refusal.
func (s *Service) replayAfterRefusal(ctx context.Context, key string, fingerprint []byte) (inventory.Order, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var prior *inventory.Order
	// The transaction only reads: what it read was committed, so a commit
	// whose answer is lost afterwards does not undo it.
	_ = s.store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
		found, err := s.lookupKey(ctx, tx, key, fingerprint)
		prior = found
		return err
	})
	if prior == nil {
		return inventory.Order{}, false
	}
	s.log.Debug("order replayed after a refusal", "order_id", prior.ID, "sku", prior.SKU, "idempotency_key", key)
	return *prior, true
}

// runTx runs fn in a transaction, and runs it again when the database
// aborted it to resolve a conflict or a concurrent request took the same
// idempotency key. It never runs it again after a commit whose answer was
// lost: it looks for the order instead.
func (s *Service) runTx(ctx context.Context, order inventory.Order, fn func(context.Context, inventory.Tx) error) error {
	var err error
	for attempt := 0; attempt < s.txAttempts; attempt++ {
		err = s.store.InTx(ctx, fn)
		switch {
		case errors.Is(err, inventory.ErrOutcomeUnknown):
			return s.resolveUnknownCommit(ctx, order, err)
		case errors.Is(err, inventory.ErrConflict), errors.Is(err, errKeyTaken):
			reason := "conflict"
			if errors.Is(err, errKeyTaken) {
				reason = "key_taken"
			}
			s.obs.Retried(s.strategy.Name, reason)
			if perr := inventory.Pause(ctx, backoff.Exponential(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
				return perr
			}
		default:
			return err
		}
	}
	return fmt.Errorf("%w: transaction aborted %d times: %w", inventory.ErrBusy, s.txAttempts, err)
}

// resolveUnknownCommit asks the database whether a commit whose answer was
// lost created the order, before the buyer is answered: the order's id was
// chosen before the transaction, so its row is the proof, and the lookup
// waits for the SKU's row (Tx.ResolveOrder), so its answer is final.
// Found: the order was taken (nil). Not found: it was not, and nothing
// was deducted (ErrUnavailable, not unknown). The lookup has a budget of
// its own (inventory.UnknownCommitBudget): an overloaded database that lost the
// answer often fails a lookup under the same load too (found by an
// overload run, where two buyers were told 503 for orders that existed).
func (s *Service) resolveUnknownCommit(ctx context.Context, order inventory.Order, commitErr error) error {
	found, err := s.resolve(ctx, commitErr, func(ctx context.Context) (found bool, err error) {
		// A transaction of its own: it only reads, and one whose commit
		// answer is lost is a lookup that failed (tried again).
		err = s.store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
			_, found, err = tx.ResolveOrder(ctx, order.SKU, order.ID)
			return err
		})
		return found, err
	})
	switch {
	case err != nil:
		return err
	case found:
		s.log.Warn("commit answer lost, but the order exists", "order_id", order.ID, "err", commitErr)
		return nil
	}
	return inventory.NotLanded("the order was not taken, nothing was deducted", commitErr)
}

// classify turns a deadline or cancellation that reached the caller
// unwrapped into ErrBusy, so the caller sees one of the package's errors.
func (s *Service) classify(ctx context.Context, err error) error {
	known := []error{inventory.ErrSoldOut, inventory.ErrLimitReached, inventory.ErrSaleNotStarted, inventory.ErrSaleEnded, inventory.ErrUnknownSKU, inventory.ErrInvalid, inventory.ErrIdempotencyConflict, inventory.ErrBusy, inventory.ErrUnavailable}
	for _, k := range known {
		if errors.Is(err, k) {
			return err
		}
	}
	if errors.Is(err, inventory.ErrConflict) || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", inventory.ErrBusy, err)
	}
	return err
}
