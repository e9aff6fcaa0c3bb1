package sales_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// standbyBehind is a store whose standbys never confirm: its waits for
// them fail with a lock timeout, as one queued behind a commit that waits
// for a lagging standby would (the causes are real; the standby is not).
type standbyBehind struct {
	store.Store
	waits int
}

func (s *standbyBehind) AwaitOrderReplicated(ctx context.Context, id string) error {
	s.waits++
	return fmt.Errorf("%w: lock timeout behind a commit that waits for its standby (test)", inventory.ErrBusy)
}

func (s *standbyBehind) AwaitSaleReplicated(ctx context.Context, sku string) error {
	s.waits++
	return fmt.Errorf("%w: lock timeout (test)", inventory.ErrBusy)
}

// A replay the standbys do not confirm is a 503 that may have happened:
// the order exists on the primary. Not "busy", which says nothing was
// taken (found by review: the wait's lock timeout, wrapped in, made the
// answer busy, and a client would have ordered again). Pay and cancel
// replays, and an admin's restock, sale start and catalog start replays,
// alike.
func TestAReplayItsStandbysDoNotConfirmMayHaveHappenedAndIsNeverBusy(t *testing.T) {
	for _, engine := range []string{"postgres", "mysql"} {
		t.Run(engine, func(t *testing.T) {
			db, _ := dbWithRawAccess(t, engine, 4)
			behind := &standbyBehind{Store: db}
			svc := sales.NewService(behind, sqlrow.NewConditional(), sales.WithOrderTimeout(5*time.Second), sales.WithHoldTTL(time.Hour))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "replayed", 3); err != nil {
				t.Fatal(err)
			}
			req := inventory.Request{SKU: "replayed", Quantity: 1, UserID: "buyer", IdempotencyKey: "k-1"}
			first, err := svc.PlaceOrder(ctx, req)
			if err != nil {
				t.Fatalf("the first attempt: %v", err)
			}
			mayHaveHappened := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, inventory.ErrOutcomeUnknown) || errors.Is(err, inventory.ErrBusy) {
					t.Errorf("%s while the standbys do not confirm: %v; want outcome unknown, not busy", what, err)
				}
			}
			_, err = svc.PlaceOrder(ctx, req)
			mayHaveHappened("the order's retry", err)
			if _, err := svc.PayOrder(ctx, first.ID, "buyer"); err != nil {
				t.Fatalf("pay: %v", err) // the pay commits itself: its commit waits
			}
			_, err = svc.PayOrder(ctx, first.ID, "buyer")
			mayHaveHappened("the pay's retry", err)
			if _, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "replayed", Quantity: 2, IdempotencyKey: "r-1"}); err != nil {
				t.Fatalf("restock: %v", err)
			}
			_, err = svc.RestockSale(ctx, inventory.RestockRequest{SKU: "replayed", Quantity: 2, IdempotencyKey: "r-1"})
			mayHaveHappened("the restock's retry", err)
			start := inventory.SaleRequest{SKU: "started", Available: 5, IdempotencyKey: "s-1"}
			if _, err := svc.OpenSale(ctx, start); err != nil {
				t.Fatalf("start: %v", err)
			}
			_, err = svc.OpenSale(ctx, start)
			mayHaveHappened("the sale start's retry", err)
			catalog := inventory.CatalogRequest{IdempotencyKey: "c-1", Sales: []inventory.SaleRequest{
				{SKU: "catalog-a", Available: 5}, {SKU: "catalog-b", Available: 7}}}
			if _, err := svc.OpenCatalog(ctx, catalog); err != nil {
				t.Fatalf("catalog start: %v", err)
			}
			_, err = svc.OpenCatalog(ctx, catalog)
			mayHaveHappened("the catalog start's retry", err)
			if behind.waits != 5 {
				t.Errorf("%d waits for the standbys, want one per replay (5)", behind.waits)
			}
		})
	}
}
