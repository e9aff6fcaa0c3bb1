package sales_test

import (
	"context"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// TestRestockRetriedAfterItsKeysRetentionIsAppliedOnce: claim 1 lists "a
// retry after the key's row was pruned at 24h" among the retries that
// never apply twice. Schedule: POST restock {quantity: 5}, key K, applied
// (its answer lost); 24h later the admin's job retries it with K; the key's
// row is past AdminKeyRetention, FindAdminKey answers not found, and the
// restock is applied again (the audit lists two restocks with key K).
func TestRestockRetriedAfterItsKeysRetentionIsAppliedOnce(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, raw := dbWithRawAccess(t, engine, 8)
			svc := sales.NewService(db, sqlrow.NewConditional())
			if err := svc.StartSale(ctx, "aged", 10); err != nil {
				t.Fatal(err)
			}
			req := inventory.RestockRequest{SKU: "aged", Quantity: 5, IdempotencyKey: "restock-aged-1"}
			if _, err := svc.RestockSale(ctx, req); err != nil {
				t.Fatal(err)
			}
			raw.exec(t,
				`UPDATE admin_idempotency_keys SET created_at = created_at - interval '25 hours'`,
				`UPDATE admin_idempotency_keys SET created_at = created_at - INTERVAL 25 HOUR`)
			r, err := svc.RestockSale(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			a, err := svc.Audit(ctx, "aged")
			if err != nil {
				t.Fatal(err)
			}
			if r.Replayed == false || a.Restocked != 5 {
				t.Errorf("the retry with key %q after 24h: replayed %v, restocked %d in %d restocks (want 5 once)", req.IdempotencyKey, r.Replayed, a.Restocked, len(a.Restocks))
			}
		})
	}
}
