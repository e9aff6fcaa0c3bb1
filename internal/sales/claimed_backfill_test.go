package sales_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
)

// backfillOf is the UPDATE of migration 00007 that sets orders.claimed for
// the orders written before it, read from the migration itself.
func backfillOf(t *testing.T, engine string) string {
	t.Helper()
	b, err := os.ReadFile("../../sql/" + engine + "/00007_admin_keys_and_claims.sql")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)UPDATE orders o[^;]*`).Find(b)
	if m == nil {
		t.Fatal("no backfill UPDATE in the migration")
	}
	return strings.TrimSpace(string(m))
}

// TestBackfilledClaimsNeverExceedTheBuyersCount: claim 3 across the
// migration. Before 00007, instances with and without PER_USER_LIMIT could
// share a SKU (GREATEST kept the count sane). Schedule:
//
//  1. instance A (no limit) takes O1: buyer u, 3 units, held; no count.
//  2. instance B (limit 5) takes O2: u, 2 units, held; u's count is 2.
//  3. migration 00007: claimed defaults to 0, and the backfill sets
//     claimed = quantity for every held order whose buyer has a row: O1
//     gets 3, O2 gets 2 — 5 claimed on a count of 2.
//  4. u cancels O1: units = 2 - 3 < 0, the CHECK refuses: the cancel fails.
//  5. O1 lapses: every sweep picks it first (oldest expiry) and its batch
//     fails whole, so a healthy lapsed hold of another SKU never expires.
func TestBackfilledClaimsNeverExceedTheBuyersCount(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, raw := dbWithRawAccess(t, engine, 8)
			unlimited := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour))
			limited := sales.NewService(db, sqlrow.NewConditional(), sales.WithHoldTTL(time.Hour), sales.WithPerUserLimit(5))
			for _, sku := range []string{"bf", "bf-other"} {
				if err := limited.StartSale(ctx, sku, 10); err != nil {
					t.Fatal(err)
				}
			}
			o1 := place(t, unlimited, "bf", "u", 3)
			o2 := place(t, limited, "bf", "u", 2)
			other := place(t, limited, "bf-other", "v", 1)

			// The database as the code before 00007 left it, then the
			// migration's backfill.
			raw.exec(t, `UPDATE orders SET claimed = 0`, `UPDATE orders SET claimed = 0`)
			raw.exec(t, backfillOf(t, engine), backfillOf(t, engine))
			t.Logf("after the backfill: O1 claimed %d, O2 claimed %d, u's count %d",
				raw.queryInt(t, `SELECT claimed FROM orders WHERE id = $1`, `SELECT claimed FROM orders WHERE id = ?`, o1.ID),
				raw.queryInt(t, `SELECT claimed FROM orders WHERE id = $1`, `SELECT claimed FROM orders WHERE id = ?`, o2.ID),
				raw.queryInt(t, `SELECT units FROM buyer_units WHERE user_id = 'u'`, `SELECT units FROM buyer_units WHERE user_id = 'u'`))

			if _, err := limited.CancelOrder(ctx, o1.ID, "u"); err != nil {
				t.Errorf("cancel of an order taken before the migration: %v (a stuck hold)", err)
			}

			// Both holds lapse; the sweep must expire the healthy one.
			raw.lapse(t, other.ID)
			if raw.state(t, o1.ID) == inventory.OrderHeld {
				raw.lapse(t, o1.ID)
			}
			n, err := limited.ExpireHolds(ctx, sales.DefaultSweepBatch)
			if err != nil {
				t.Errorf("sweep: %v (expired %d)", err, n)
			}
			if s := raw.state(t, other.ID); s != inventory.OrderExpired {
				t.Errorf("a lapsed hold of another SKU and buyer is %q after the sweep: one order's bad claim stops every expiry", s)
			}
		})
	}
}
