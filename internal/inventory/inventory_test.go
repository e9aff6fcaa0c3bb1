package inventory_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/testdb"
)

func TestValidateUserID(t *testing.T) {
	for _, ok := range []string{"u", "u-9", "Zoë", strings.Repeat("é", inventory.MaxUserIDLength), "a b", "用户"} {
		if err := inventory.ValidateUserID(ok); err != nil {
			t.Errorf("ValidateUserID(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		"a\x00b",
		"a\tb",
		"a\nb",
		"\x1b[31m",
		"a\x7fb",
		"a\u0085b",              // C1 control
		"a\u2028b",              // line separator
		"a\u202eb",              // right-to-left override
		"a\xffb",                // not UTF-8
		"\xed\xa0\x80",          // an encoded surrogate is not UTF-8
		strings.Repeat("u", 65), // too long
		strings.Repeat("é", 65), // too long in characters
	} {
		err := inventory.ValidateUserID(bad)
		if !errors.Is(err, inventory.ErrInvalid) {
			t.Errorf("ValidateUserID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

// TestPlaceOrderRefusesBadUserID: the service itself refuses what the
// databases would choke on (PostgreSQL refuses NUL in text), whatever the
// entrance, and nothing is deducted.
func TestPlaceOrderRefusesBadUserID(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			svc := inventory.NewService(testdb.New(t, engine, 2), inventory.NewConditional())
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
