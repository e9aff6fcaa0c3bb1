package sales

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sync/errgroup"

	"github.com/flashsale/stock/internal/inventory"
)

// A catalog's start (PUT /admin/stock): many SKUs put on sale in one
// request, each as OpenSale puts one, in one database transaction, so
// that every SKU starts or none does; an Idempotency-Key names the whole
// request.

// resetWidth bounds the SKUs whose strategy state (lock keys) is reset at
// once after a catalog's start: each reset is a round trip to the lock's
// server.
const resetWidth = 32

// OpenCatalog starts the sale of every SKU req lists. A bad row is
// ErrInvalid naming it, and nothing is started. With an idempotency key, a
// retry of the same request (its rows in any order) answers the first
// start (Replayed) and starts nothing again; a retry whose first attempt
// committed in the database but did not reach the strategy's own store
// completes it. The same key with another request is
// ErrIdempotencyConflict.
func (s *Service) OpenCatalog(ctx context.Context, req inventory.CatalogRequest) (inventory.CatalogStarted, error) {
	if err := req.Validate(); err != nil {
		return inventory.CatalogStarted{}, err
	}
	c := inventory.CatalogStart{Starts: req.Starts()}
	// After the start, whatever its answer, as OpenSale does.
	defer func() {
		for _, st := range c.Starts {
			s.soldOut.clear(st.SKU)
		}
	}()
	if req.IdempotencyKey != "" {
		c.Key = inventory.AdminRecord{Key: req.IdempotencyKey, Action: inventory.AdminCatalog, RequestHash: req.Fingerprint()}
		if _, found, err := s.adminKey(ctx, c.Key); err != nil || found {
			if err != nil {
				return inventory.CatalogStarted{}, err
			}
			return s.replayCatalog(ctx, c)
		}
	}
	err := s.retryConflicts(ctx, "starting the catalog", func() error { return s.startCatalog(ctx, c) })
	if errors.Is(err, inventory.ErrAdminKeyTaken) {
		// A retry racing its first attempt: the one that recorded the key
		// started the sales.
		_, found, ferr := s.adminKey(ctx, c.Key)
		switch {
		case ferr != nil:
			return inventory.CatalogStarted{}, ferr
		case !found:
			return inventory.CatalogStarted{}, fmt.Errorf("%w: key %q was taken, then not found", inventory.ErrBusy, c.Key.Key)
		}
		return s.replayCatalog(ctx, c)
	}
	if err != nil {
		return inventory.CatalogStarted{}, s.classify(ctx, err)
	}
	return inventory.CatalogStarted{SKUs: len(c.Starts)}, nil
}

// startCatalog starts the catalog: the strategy's own start when it keeps
// the sale outside the database, else the database's, then the
// strategy's per-SKU state, as startSale does for one.
func (s *Service) startCatalog(ctx context.Context, c inventory.CatalogStart) error {
	if start := s.strategy.StartCatalog; start != nil {
		return start(ctx, c)
	}
	if _, err := s.store.StartCatalogWith(ctx, c); err != nil {
		return err
	}
	return s.resetCatalog(ctx, c.Starts)
}

// resetCatalog resets the strategy's per-SKU state (lock keys) of the
// catalog's SKUs: in batches where the strategy can (ResetSKUs), else SKU
// by SKU, resetWidth at once.
func (s *Service) resetCatalog(ctx context.Context, starts []inventory.SaleStart) error {
	if resetAll := s.strategy.ResetSKUs; resetAll != nil {
		skus := make([]string, len(starts))
		for i, st := range starts {
			skus[i] = st.SKU
		}
		if err := resetAll(ctx, skus); err != nil {
			return fmt.Errorf("reset %s state of %d SKUs: %w", s.strategy.Name, len(skus), err)
		}
		return nil
	}
	reset := s.strategy.ResetSKU
	if reset == nil {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(resetWidth)
	for _, st := range starts {
		g.Go(func() error {
			if err := reset(gctx, st.SKU); err != nil {
				return fmt.Errorf("reset %s state of %q: %w", s.strategy.Name, st.SKU, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// replayCatalog answers a catalog start whose key the database has: the
// sales were started. A strategy that keeps its own sales is asked to
// finish them (its store may have missed some: the first attempt's 503);
// one that keeps lock keys resets them again, since the first attempt may
// have failed after its commit, in the reset (found by review: the retry
// the 503 asks for answered 200 with the locks of the old sales left).
// Resetting a lock again is safe: a holder that loses it cannot write
// past the fence and the row's version.
func (s *Service) replayCatalog(ctx context.Context, c inventory.CatalogStart) (inventory.CatalogStarted, error) {
	// Read, not committed by this call: the start may be on the primary
	// alone. One SKU's wait covers every SKU: the standby receives the
	// WAL in order, so the wait's commit brings every commit before it.
	if len(c.Starts) > 0 {
		if err := s.awaitReplicated(ctx, "", c.Starts[0].SKU); err != nil {
			return inventory.CatalogStarted{}, err
		}
	}
	if finish := s.strategy.FinishCatalog; finish != nil {
		if err := finish(ctx, c.Starts); err != nil {
			return inventory.CatalogStarted{}, s.classify(ctx, err)
		}
	} else if err := s.resetCatalog(ctx, c.Starts); err != nil {
		return inventory.CatalogStarted{}, s.classify(ctx, err)
	}
	s.log.Debug("catalog start replayed", "skus", len(c.Starts), "idempotency_key", c.Key.Key)
	return inventory.CatalogStarted{SKUs: len(c.Starts), Replayed: true}, nil
}
