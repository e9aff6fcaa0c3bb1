package sales_test

import (
	"context"
	"errors"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// TestPlaceOrderRefusesBadUserID: the service itself refuses what the
// databases would choke on (PostgreSQL refuses NUL in text), whatever the
// entrance, and nothing is deducted.
func TestPlaceOrderRefusesBadUserID(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			svc := sales.NewService(testdb.New(t, engine, 2), sqlrow.NewConditional())
			if err := svc.StartSale(ctx, "s-1", 5); err != nil {
				t.Fatal(err)
			}
			for _, id := range []string{"", "a\x00b", "a\rb", "a\xffb"} {
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "s-1", Quantity: 1, UserID: id}); !errors.Is(err, inventory.ErrInvalid) {
					t.Errorf("user_id %q: %v, want ErrInvalid", id, err)
				}
			}
			a, err := svc.Audit(ctx, "s-1")
			if err != nil {
				t.Fatal(err)
			}
			if a.Available != 5 || a.Orders != 0 {
				t.Errorf("refused orders changed the sale: %+v", a)
			}
		})
	}
}
