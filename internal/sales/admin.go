package sales

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashsale/stock/internal/backoff"
	"github.com/flashsale/stock/internal/inventory"
)

// The admin writes: a sale's start and a restock. A client may retry
// either (its answer lost to a timeout, a 503), so each honours an
// Idempotency-Key as an order does: the key is recorded in the write's
// own transaction, a retry that finds it answers the first write and
// applies nothing, and the same key with another request is
// ErrIdempotencyConflict. Without a key, a restock whose commit answer
// was lost is still resolved before it is answered (its row is the
// proof), so a 503 tells the admin it was not applied.

// StartSale sets the SKU's stock to n, forgets its orders and idempotency
// keys, and clears whatever state the strategy keeps for it.
func (s *Service) StartSale(ctx context.Context, sku string, n int64) error {
	return s.StartSaleWindow(ctx, sku, n, inventory.SaleWindow{})
}

// StartSaleWindow is StartSale with a window: before w.StartsAt and from
// w.EndsAt on (the database's clock), orders are refused with
// ErrSaleNotStarted and ErrSaleEnded and change nothing.
func (s *Service) StartSaleWindow(ctx context.Context, sku string, n int64, w inventory.SaleWindow) error {
	_, err := s.OpenSale(ctx, inventory.SaleRequest{SKU: sku, Available: n, Window: w})
	return err
}

// OpenSale starts the sale req describes. With an idempotency key, a
// retry of the same request answers the first start (Replayed) and
// starts nothing again, even after orders were taken in the sale it
// started; a retry whose first attempt committed in the database but did
// not reach the strategy's own store (redis-reserve's Redis) completes
// it. The same key with another request is ErrIdempotencyConflict.
func (s *Service) OpenSale(ctx context.Context, req inventory.SaleRequest) (inventory.SaleStarted, error) {
	if err := req.Validate(); err != nil {
		return inventory.SaleStarted{}, err
	}
	// The mark is lifted once the start is over, whatever its answer: a
	// start that failed may have landed (a lost commit answer), and a
	// lifted mark only means the next order asks the store (found by
	// review: an unknown outcome kept the old sale's mark for up to its
	// ttl). After the start, never before: an order the old sale refused
	// while the start was on its way would mark the new sale sold out.
	defer s.soldOut.clear(req.SKU)
	st := inventory.SaleStart{SKU: req.SKU, Available: req.Available, Window: req.Window}
	if req.IdempotencyKey != "" {
		st.Key = inventory.AdminRecord{Key: req.IdempotencyKey, Action: inventory.AdminStart, SKU: req.SKU, RequestHash: req.Fingerprint()}
		if rec, found, err := s.adminKey(ctx, st.Key); err != nil || found {
			if err != nil {
				return inventory.SaleStarted{}, err
			}
			return s.replayStart(ctx, req, st, rec)
		}
	}
	err := s.startSale(ctx, st)
	if errors.Is(err, inventory.ErrAdminKeyTaken) {
		// A retry racing its first attempt: the one that recorded the key
		// started the sale.
		rec, found, ferr := s.adminKey(ctx, st.Key)
		switch {
		case ferr != nil:
			return inventory.SaleStarted{}, ferr
		case !found:
			return inventory.SaleStarted{}, fmt.Errorf("%w: key %q was taken, then not found", inventory.ErrBusy, st.Key.Key)
		}
		return s.replayStart(ctx, req, st, rec)
	}
	if err != nil {
		return inventory.SaleStarted{}, s.classify(ctx, err)
	}
	return inventory.SaleStarted{Request: req}, nil
}

// replayStart answers a start whose key the database has: the sale was
// started. A strategy that keeps its own sale is asked to finish it (its
// store may have missed it: the first attempt's 503).
func (s *Service) replayStart(ctx context.Context, req inventory.SaleRequest, st inventory.SaleStart, rec inventory.AdminRecord) (inventory.SaleStarted, error) {
	// Read, not committed by this call: the start may be on the primary
	// alone, and a strategy's state must not be loaded from it.
	if err := s.awaitReplicated(ctx, "", st.SKU); err != nil {
		return inventory.SaleStarted{}, err
	}
	if finish := s.strategy.FinishStart; finish != nil {
		if err := finish(ctx, st, rec.Sale); err != nil {
			return inventory.SaleStarted{}, s.classify(ctx, err)
		}
	} else if reset := s.strategy.ResetSKU; reset != nil {
		// The first attempt may have failed after its commit, in the
		// reset (as replayCatalog says).
		if err := reset(ctx, st.SKU); err != nil {
			return inventory.SaleStarted{}, s.classify(ctx, fmt.Errorf("reset %s state of %q: %w", s.strategy.Name, st.SKU, err))
		}
	}
	s.log.Debug("sale start replayed", "sku", req.SKU, "sale", rec.Sale, "idempotency_key", req.IdempotencyKey)
	return inventory.SaleStarted{Request: req, Replayed: true}, nil
}

// startSale starts the sale, again when the database aborted it to
// resolve a deadlock: a cancel or an expiry locks its order row and then
// the stock row, the start the stock row and then the SKU's order rows,
// and the one the database picks as the victim runs again (nothing of it
// was written). Past the attempts it is ErrBusy, never the bare conflict.
func (s *Service) startSale(ctx context.Context, st inventory.SaleStart) error {
	return s.retryConflicts(ctx, "starting the sale", func() error {
		if start := s.strategy.StartSale; start != nil {
			return start(ctx, st)
		}
		// The database first, then the strategy's state. Neither sets
		// anything back: a start bumps the version and keeps the fence,
		// and the lock's Reset keeps its fencing counter, so tokens stay
		// above every fence.
		if _, err := s.store.StartSaleWith(ctx, st); err != nil {
			return err
		}
		if reset := s.strategy.ResetSKU; reset != nil {
			if err := reset(ctx, st.SKU); err != nil {
				return fmt.Errorf("reset %s state of %q: %w", s.strategy.Name, st.SKU, err)
			}
		}
		return nil
	})
}

// retryConflicts runs write again while the database aborts it to resolve
// a conflict (nothing of it was written), at most txAttempts times, then
// answers ErrBusy.
func (s *Service) retryConflicts(ctx context.Context, what string, write func() error) error {
	var err error
	for attempt := 0; attempt < s.txAttempts; attempt++ {
		if err = write(); !errors.Is(err, inventory.ErrConflict) {
			return err
		}
		s.obs.Retried(s.strategy.Name, "conflict")
		if perr := inventory.Pause(ctx, backoff.Exponential(attempt, time.Millisecond, 20*time.Millisecond)); perr != nil {
			return fmt.Errorf("%w: %s: %w", inventory.ErrBusy, what, errors.Join(perr, err))
		}
	}
	return fmt.Errorf("%w: %s was aborted %d times by conflicts: %w", inventory.ErrBusy, what, s.txAttempts, err)
}

// adminKey looks an admin write's key up: found with the record when the
// key names the same request, ErrIdempotencyConflict when another.
func (s *Service) adminKey(ctx context.Context, want inventory.AdminRecord) (inventory.AdminRecord, bool, error) {
	rec, found, err := s.store.FindAdminKey(ctx, want.Key)
	if err != nil {
		return inventory.AdminRecord{}, false, s.classify(ctx, err)
	}
	if !found {
		return inventory.AdminRecord{}, false, nil
	}
	if rec.Action != want.Action || !bytes.Equal(rec.RequestHash, want.RequestHash) {
		return inventory.AdminRecord{}, false, fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, want.Key)
	}
	return rec, true, nil
}

// Restock adds n units to the SKU's current sale without deleting its
// orders and returns the stock after it.
func (s *Service) Restock(ctx context.Context, sku string, n int64) (inventory.Level, error) {
	r, err := s.RestockSale(ctx, inventory.RestockRequest{SKU: sku, Quantity: n})
	return r.Level, err
}

// RestockSale adds req.Quantity units to the SKU's current sale without
// deleting its orders: ErrUnknownSKU when no sale was started, ErrInvalid
// for a quantity outside 1..MaxInitialStock. Like a return it only adds,
// so it leaves the stock's version alone. With an idempotency key, a retry
// of the same request answers the first restock (Replayed) and adds
// nothing, whatever became of the first answer; the same key with another
// request is ErrIdempotencyConflict. A restock whose commit answer was
// lost is looked up before it is answered: found, it is answered as
// applied; not found, ErrUnavailable (it was not applied); only when the
// database does not answer for the lookup's whole budget is it
// ErrOutcomeUnknown.
func (s *Service) RestockSale(ctx context.Context, req inventory.RestockRequest) (inventory.Restocked, error) {
	if err := req.Validate(); err != nil {
		return inventory.Restocked{}, err
	}
	if s.strategy.StartSale != nil && s.relay == nil {
		return inventory.Restocked{}, fmt.Errorf("%w: %s counts the stock outside the database and cannot restock; start a new sale instead", inventory.ErrInvalid, s.strategy.Name)
	}
	// Bounded like an order: a restock behind a busy row answers busy
	// rather than hold its admin's request open. The answer after the
	// commit has time of its own (answerRestock).
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var key inventory.AdminRecord
	if req.IdempotencyKey != "" {
		key = inventory.AdminRecord{Key: req.IdempotencyKey, Action: inventory.AdminRestock, SKU: req.SKU, RequestHash: req.Fingerprint()}
		if rec, found, err := s.adminKey(ctx, key); err != nil || found {
			if err != nil {
				return inventory.Restocked{}, err
			}
			return s.replayRestock(ctx, req, rec)
		}
		// The admin key is kept for AdminKeyRetention; the sale's
		// restocks, with their keys, for the sale's life: a retry later
		// than the key's retention, in the same sale, finds it there.
		prior, found, err := s.store.FindRestockByKey(ctx, req.SKU, req.IdempotencyKey)
		if err != nil {
			return inventory.Restocked{}, s.classify(ctx, err)
		}
		if found {
			if prior.Quantity != req.Quantity {
				return inventory.Restocked{}, fmt.Errorf("%w: key %q", inventory.ErrIdempotencyConflict, req.IdempotencyKey)
			}
			return s.replayRestock(ctx, req, inventory.AdminRecord{Key: key.Key, Action: inventory.AdminRestock, SKU: req.SKU, RestockID: prior.ID})
		}
	}
	restock := inventory.Restock{ID: s.newID(), SKU: req.SKU, Quantity: req.Quantity, Key: req.IdempotencyKey}
	var available int64
	err := s.retryConflicts(ctx, "the restock", func() error {
		return s.store.InTx(ctx, func(ctx context.Context, tx inventory.Tx) error {
			avail, sale, ok, err := tx.Restock(ctx, req.SKU, req.Quantity)
			if err == nil && !ok {
				err = fmt.Errorf("%w: %q", inventory.ErrUnknownSKU, req.SKU)
			}
			if err != nil {
				return err
			}
			available = avail
			// The strategy counts the stock elsewhere: the restock
			// reaches it through the relay, once, as a return does.
			if err := tx.RecordRestock(ctx, restock, s.relay != nil); err != nil {
				return err
			}
			if key.Key == "" {
				return nil
			}
			key.Sale, key.RestockID = sale, restock.ID
			inserted, err := tx.InsertAdminKey(ctx, key)
			if err == nil && !inserted {
				err = inventory.ErrAdminKeyTaken
			}
			return err
		})
	})
	switch {
	case errors.Is(err, inventory.ErrAdminKeyTaken):
		// A retry racing its first attempt, which committed first.
		rec, found, ferr := s.adminKey(ctx, key)
		switch {
		case ferr != nil:
			return inventory.Restocked{}, ferr
		case !found:
			return inventory.Restocked{}, fmt.Errorf("%w: key %q was taken, then not found", inventory.ErrBusy, key.Key)
		}
		return s.replayRestock(ctx, req, rec)
	case errors.Is(err, inventory.ErrOutcomeUnknown):
		// The restock may have committed: lift the mark rather than
		// refuse its units for up to SOLD_OUT_TTL, then ask.
		s.soldOut.clear(req.SKU)
		found, rerr := s.resolve(ctx, err, func(ctx context.Context) (bool, error) {
			return s.store.ResolveRestock(ctx, req.SKU, restock.ID)
		})
		if rerr != nil {
			return inventory.Restocked{}, rerr
		}
		if !found {
			return inventory.Restocked{}, inventory.NotLanded("the restock was not applied, nothing was added", err)
		}
		s.log.Warn("restock commit answer lost, but the restock exists", "sku", req.SKU, "restock_id", restock.ID, "err", err)
		available = -1
	case err != nil:
		return inventory.Restocked{}, s.classify(ctx, err)
	}
	s.unitsBack(ctx, req.SKU)
	return inventory.Restocked{Restock: restock, Level: s.levelAfter(ctx, req.SKU, available)}, nil
}

// replayRestock answers a restock whose key the database has: nothing is
// added; its units are relayed again if they were not (the relay takes
// each restock once), and the answer is the stock as it is now.
func (s *Service) replayRestock(ctx context.Context, req inventory.RestockRequest, rec inventory.AdminRecord) (inventory.Restocked, error) {
	// Read, not committed by this call: the restock may be on the primary
	// alone, and must be neither relayed nor answered from there.
	if err := s.awaitReplicated(ctx, "", req.SKU); err != nil {
		return inventory.Restocked{}, err
	}
	s.unitsBack(ctx, req.SKU)
	s.log.Debug("restock replayed", "sku", req.SKU, "restock_id", rec.RestockID, "idempotency_key", req.IdempotencyKey)
	restock := inventory.Restock{ID: rec.RestockID, SKU: rec.SKU, Quantity: req.Quantity, Key: req.IdempotencyKey}
	return inventory.Restocked{Restock: restock, Level: s.levelAfter(ctx, req.SKU, -1), Replayed: true}, nil
}

// levelAfter is the SKU's stock to answer a restock that committed with:
// the strategy's own count when it keeps one (what its orders see), else
// available as the restock's statement returned it; when that count does
// not answer, or available is unknown (-1), the database's level, read
// with time of its own. A restock that committed is never answered with
// an error, which would invite a retry that adds it twice; at worst its
// level is the one the restock's statement saw.
func (s *Service) levelAfter(ctx context.Context, sku string, available int64) inventory.Level {
	if s.relay == nil && available >= 0 {
		return inventory.Level{Available: available}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), relayWait)
	defer cancel()
	if level, err := s.Level(ctx, sku); err == nil {
		return level
	} else if s.relay != nil {
		s.log.Warn("restock committed, the strategy's store does not answer: answered with the database's level", "sku", sku, "err", err)
	}
	if level, err := s.store.Level(ctx, sku); err == nil {
		return level
	}
	return inventory.Level{Available: max(available, 0)}
}

// resolveAttempt bounds one try of that lookup.
const resolveAttempt = 2 * time.Second

// resolve asks lookup, with inventory.UnknownCommitBudget of its own, whether a
// write whose commit answer was lost (commitErr) landed, and tries again
// while the database fails to answer. It returns lookup's answer, or
// commitErr (ErrOutcomeUnknown) when no try was answered.
func (s *Service) resolve(ctx context.Context, commitErr error, lookup func(context.Context) (bool, error)) (bool, error) {
	budget, cancel := context.WithTimeout(context.WithoutCancel(ctx), inventory.UnknownCommitBudget)
	defer cancel()
	for attempt := 0; ; attempt++ {
		try, cancelTry := context.WithTimeout(budget, resolveAttempt)
		found, err := lookup(try)
		cancelTry()
		if err == nil {
			return found, nil
		}
		if inventory.Pause(budget, backoff.Exponential(attempt, 20*time.Millisecond, 500*time.Millisecond)) != nil {
			s.log.Warn("a write's commit answer was lost and the database did not answer its lookup", "err", commitErr, "lookup", err)
			return false, commitErr
		}
	}
}
