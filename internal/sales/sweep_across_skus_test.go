package sales_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// TestSweepAcrossSKUsGivesBackEveryUnitAndClaim: one sweep batch of
// lapsed holds spread over 40 SKUs and 30 buyers (most buyers on two SKUs,
// one buyer with two orders of one SKU) gives every unit back to its SKU
// and every claimed unit back to its buyer's count, on both engines, now
// that a batch returns them by one statement for all its SKUs
// (Tx.ReturnEach, Tx.ReleaseEach) instead of one per SKU.
func TestSweepAcrossSKUsGivesBackEveryUnitAndClaim(t *testing.T) {
	const skus, stock, buyers = 40, 3, 30
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			db, raw := dbWithRawAccess(t, engine, 8)
			svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour),
				sales.WithPerUserLimit(2), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			sku := func(i int) string { return fmt.Sprintf("across-%02d", i%skus) }
			for i := range skus {
				if err := svc.StartSale(ctx, sku(i), stock); err != nil {
					t.Fatal(err)
				}
			}
			placed := 0
			for b := range buyers {
				user := fmt.Sprintf("buyer-%02d", b)
				for _, s := range []string{sku(b), sku(b*7 + 3)} {
					place(t, svc, s, user, 1)
					placed++
				}
			}
			place(t, svc, sku(0), "buyer-00", 1) // its second unit of that SKU: its limit
			placed++
			if got := raw.exec(t,
				`UPDATE orders SET expires_at = now() - interval '1 second' WHERE state = 'held'`,
				`UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE state = 'held'`); got != int64(placed) {
				t.Fatalf("lapsed %d holds, placed %d", got, placed)
			}
			n, err := svc.ExpireHolds(ctx, sales.DefaultSweepBatch)
			if err != nil || n != placed {
				t.Fatalf("the sweep expired %d and answered %v; want %d, nil", n, err, placed)
			}
			for i := range skus {
				checkAudit(t, svc, sku(i), stock)
				if a, err := svc.Audit(ctx, sku(i)); err != nil || a.Available != stock || a.Held != 0 {
					t.Errorf("%s after the sweep: %+v, %v; want %d available, none held", sku(i), a, err, stock)
				}
			}
			if left := raw.queryInt(t, `SELECT COALESCE(SUM(units), 0) FROM buyer_units`, `SELECT COALESCE(SUM(units), 0) FROM buyer_units`); left != 0 {
				t.Errorf("the buyers' counts hold %d units after every order expired; want 0", left)
			}
			// The limit counts again from nothing: the buyer of two units
			// of across-00 may hold two again.
			for range 2 {
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku(0), Quantity: 1, UserID: "buyer-00"}); err != nil {
					t.Errorf("buyer-00's order after its holds expired: %v", err)
				}
			}
		})
	}
}

// TestSweepGivesBackEveryClaimOfIdsMariaDBPadsToOneBuyer (MariaDB): user
// ids that differ only in trailing spaces are one buyer_units row there
// (utf8mb4_bin pads). New orders refuse such ids, but rows written before
// that may hold them. One sweep batch expiring an order of "pad" and one
// of "pad " must give back both units to that one row: without summing
// them under one spelling, ReleaseEach's CASE would apply only its first
// matching WHEN and leave a unit claimed.
func TestSweepGivesBackEveryClaimOfIdsMariaDBPadsToOneBuyer(t *testing.T) {
	db, raw := dbWithRawAccess(t, "mysql", 4)
	svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour),
		sales.WithPerUserLimit(2), sales.WithOrderTimeout(30*time.Second))
	ctx := context.Background()
	if err := svc.StartSale(ctx, "pad-sku", 5); err != nil {
		t.Fatal(err)
	}
	place(t, svc, "pad-sku", "pad", 1)
	second := place(t, svc, "pad-sku", "pad", 1)
	// The second order as a row written before ids with trailing spaces
	// were refused.
	raw.exec(t, ``, `UPDATE orders SET user_id = 'pad ' WHERE id = ?`, second.ID)
	raw.exec(t, ``, `UPDATE orders SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE state = 'held'`)
	if n, err := svc.ExpireHolds(ctx, sales.DefaultSweepBatch); err != nil || n != 2 {
		t.Fatalf("the sweep expired %d and answered %v; want 2, nil", n, err)
	}
	if left := raw.queryInt(t, ``, `SELECT COALESCE(SUM(units), 0) FROM buyer_units`); left != 0 {
		t.Errorf("the buyer's row holds %d units after both its orders expired; want 0", left)
	}
	checkAudit(t, svc, "pad-sku", 5)
}
