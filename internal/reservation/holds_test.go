package reservation_test

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/store"
)

// TestHeldOrdersReachTheDatabaseHeld: an order taken with a hold is
// carried by the stream with its hold, and written held, its expires_at
// set on the database's clock when it is written (a final order stays
// final), on both engines and both ways of taking orders. This is the
// first step of holds on the reservation strategies
// (docs/design/lifecycle-plan.md); the service refuses HOLD_TTL with them
// until their returns reach Redis.
func TestHeldOrdersReachTheDatabaseHeld(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			forEachMode(t, func(t *testing.T, m mode) {
				s := newSaleIn(t, engine, m)
				s.consume(s.db)
				s.start("held", 5)
				ctx := context.Background()
				held := inventory.Order{ID: "0b7c1a3e-3f4e-4f57-9a58-0c8d2b8e1f01", SKU: "held", Quantity: 2, UserID: "payer", Strategy: m.name, Hold: time.Hour}
				final := inventory.Order{ID: "0b7c1a3e-3f4e-4f57-9a58-0c8d2b8e1f02", SKU: "held", Quantity: 1, UserID: "other", Strategy: m.name}
				before := time.Now()
				for _, o := range []inventory.Order{held, final} {
					if _, err := s.res.Reserve(ctx, reservation.Reservation{Order: o}); err != nil {
						t.Fatal(err)
					}
				}
				s.seen.waitFor(t, 2)
				got, found, err := s.db.FindOrder(ctx, held.ID)
				if err != nil || !found {
					t.Fatalf("the held order in the database: %v, %v", found, err)
				}
				// The database's clock and this process's agree within
				// a few seconds here; the hold is an hour.
				if got.State != inventory.OrderHeld || got.ExpiresAt.Before(before.Add(time.Hour-5*time.Second)) || got.ExpiresAt.After(time.Now().Add(time.Hour+5*time.Second)) {
					t.Errorf("held order written as %q expiring %v, want held about an hour after %v", got.State, got.ExpiresAt, before)
				}
				got, found, err = s.db.FindOrder(ctx, final.ID)
				if err != nil || !found || got.State != inventory.OrderFinal || !got.ExpiresAt.IsZero() {
					t.Errorf("final order written as %+v (%v, %v)", got, found, err)
				}
				if a, err := s.db.Audit(ctx, "held"); err != nil || a.Held != 2 || a.Paid != 1 || a.Available != 2 || !a.Consistent() {
					t.Errorf("database audit %+v, %v: want 2 held, 1 paid (final), 2 available", a, err)
				}
			})
		})
	}
}
