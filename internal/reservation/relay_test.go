package reservation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
)

// holding makes the sale's service take orders held for an hour.
func (s *sale) holding(m mode) {
	s.svc = sales.NewService(s.db, reservation.NewReserved(s.res, s.db, reservation.WithReservedName(m.name)),
		sales.WithHoldTTL(time.Hour), sales.WithOrderTimeout(10*time.Second))
}

// quiet waits (10 s at most) until nothing of the SKU is in flight: every
// order written, every return relayed; it returns the audit then.
func (s *sale) quiet(sku string) inventory.Audit {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := s.svc.Audit(context.Background(), sku)
		if err == nil && a.Pending == 0 && a.Relaying == 0 && a.Written != nil && a.Written.Orders == a.Orders {
			return a
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("after 10 s the audit of %s still has orders or returns in flight: %+v, %v", sku, a, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the consumer's and the relay's progress
	}
}

// TestRelayGivesEachReturnBackOnce: a cancel returns the order's units in
// the database and, through the relay, in Redis, where they sell again
// (the relay lists a sale that left the catalog sold out first); handing
// the same return to Redis again (a relay whose commit was lost runs
// again) adds nothing.
func TestRelayGivesEachReturnBackOnce(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			forEachMode(t, func(t *testing.T, m mode) {
				s := newSaleIn(t, engine, m)
				s.holding(m)
				s.consume(s.db)
				const sku = "relay-once"
				s.start(sku, 2)
				ctx := context.Background()
				a, err := s.order(sku, 2, "a", "")
				if err != nil {
					t.Fatal(err)
				}
				if _, err := s.order(sku, 1, "b", ""); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("an order of a sold-out sale: %v", err)
				}
				s.drained(sku, 1)
				// Sold out and drained: the consumers' sweep may take the
				// sale off the catalog.
				if err := s.rdb.ZRem(ctx, catalogKey, sku).Err(); err != nil {
					t.Fatal(err)
				}
				if got, err := s.svc.CancelOrder(ctx, a.ID, "a"); err != nil || got.State != inventory.OrderCancelled {
					t.Fatalf("cancel: %+v, %v", got, err)
				}
				// The relay listed it again before it gave the units back.
				if err := s.rdb.ZScore(ctx, catalogKey, sku).Err(); err != nil {
					t.Errorf("the sale has units again but is not in the catalog: %v", err)
				}
				audit := s.quiet(sku)
				if audit.Available != 2 || audit.Orders != 0 || audit.Cancelled != 1 || !audit.Consistent() {
					t.Fatalf("after the cancel: %+v", audit)
				}
				// The same return again, as a relay that runs twice.
				a.Quantity = 2
				if err := s.res.Return(ctx, sku, audit.Sale, []inventory.Order{a}); err != nil {
					t.Fatal(err)
				}
				if tally, err := s.res.Tally(ctx, sku); err != nil || tally.Available != 2 || tally.Returned != 2 || tally.Returns != 1 {
					t.Fatalf("after the same return again: %+v, %v; want it taken once", tally, err)
				}
				// The units sell again, once.
				if _, err := s.order(sku, 2, "c", ""); err != nil {
					t.Fatalf("an order of the returned units: %v", err)
				}
				if _, err := s.order(sku, 1, "d", ""); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("an order past the returned units: %v", err)
				}
				if audit := s.quiet(sku); audit.Available != 0 || audit.Orders != 1 || audit.Held != 2 || !audit.Consistent() {
					t.Errorf("at the end: %+v", audit)
				}
			})
		})
	}
}

// TestRestockReachesRedisOnce: a restock of a sale counted in Redis is
// made in the database and relayed, and its units sell; the same restock
// handed to Redis again adds nothing.
func TestRestockReachesRedisOnce(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		s.holding(m)
		s.consume(s.db)
		ctx := context.Background()
		const sku = "restock-once"
		s.start(sku, 1)
		if level, err := s.svc.Restock(ctx, sku, 2); err != nil || level.Available != 3 {
			t.Fatalf("restock: %+v, %v; want 3 available in Redis at once", level, err)
		}
		before, err := s.res.Tally(ctx, sku)
		if err != nil {
			t.Fatal(err)
		}
		again := []inventory.Order{{ID: "5f1c9a60-8d55-4b6e-9d0e-3e1f2a7b9c01", SKU: sku, Quantity: 3}}
		for range 2 {
			if err := s.res.Restock(ctx, sku, before.Epoch, again); err != nil {
				t.Fatal(err)
			}
		}
		if tally, err := s.res.Tally(ctx, sku); err != nil || tally.Available != before.Available+3 || tally.Restocked != before.Restocked+3 {
			t.Fatalf("one restock handed over twice: %+v, %v; want it taken once after %+v", tally, err, before)
		}
	})
}

// TestReturnsWaitForARedisThatIsDown: Redis is down when a buyer cancels.
// The database decides and answers (200 cancelled), the return stays
// marked, and once Redis is back (restarted from its append-only file) the
// sweep relays it: the unit sells again, once.
func TestReturnsWaitForARedisThatIsDown(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		s.holding(m)
		s.consume(s.db)
		const sku = "relay-later"
		s.start(sku, 1)
		ctx := context.Background()
		a, err := s.order(sku, 1, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		s.drained(sku, 1)
		s.redis.Stop()
		if got, err := s.svc.CancelOrder(ctx, a.ID, "a"); err != nil || got.State != inventory.OrderCancelled {
			t.Fatalf("cancel while Redis is down: %+v, %v", got, err)
		}
		if db, err := s.db.Audit(ctx, sku); err != nil || db.RelayingOrders != 1 || db.Relaying != 1 {
			t.Fatalf("the database while Redis is down: %+v, %v; want the return marked", db, err)
		}
		s.redis.Restart(t)
		// The sweep relays what is marked, once Redis answers.
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := s.svc.ExpireHolds(ctx, 0); err != nil {
				t.Logf("sweep: %v", err)
			}
			if db, err := s.db.Audit(ctx, sku); err == nil && db.RelayingOrders == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the return was not relayed within 10 s of Redis's restart")
			}
			time.Sleep(50 * time.Millisecond) // polling a server that is starting
		}
		if _, err := s.order(sku, 1, "b", ""); err != nil {
			t.Fatalf("an order of the returned unit: %v", err)
		}
		if _, err := s.order(sku, 1, "c", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("a second order of the one returned unit: %v", err)
		}
		if audit := s.quiet(sku); audit.Available != 0 || audit.Orders != 1 || audit.Cancelled != 1 || !audit.Consistent() {
			t.Errorf("at the end: %+v", audit)
		}
	})
}

// TestCheckGivesBackAReturnAnOlderCopyLost: Redis comes back from a copy of
// its data taken before a cancel and a restock were relayed (the order
// live there, its units still taken, the restock not there). The check of
// the sale on the next order finds that Redis took every order the
// database has, and gives back the return and the restock it lost: the
// units sell again instead of being lost for the sale, and once.
//
//	sale of 3; order A (1 unit) held and written
//	copy of the SKU's keys
//	cancel A and restock 2: the database makes them, the relay gives them to Redis
//	the copy put back, the sale unchecked (as after a restart)
//	5 orders of 1: all taken (2 left + A's unit + 2 restocked); a 6th: sold out
func TestCheckGivesBackAReturnAnOlderCopyLost(t *testing.T) {
	forEachMode(t, func(t *testing.T, m mode) {
		s := newSaleIn(t, "postgres", m)
		s.holding(m)
		s.consume(s.db)
		const sku = "relay-lost"
		s.start(sku, 3)
		ctx := context.Background()
		a, err := s.order(sku, 1, "a", "")
		if err != nil {
			t.Fatal(err)
		}
		s.drained(sku, 1)
		restore := restoreKeys(t, s, sku)
		if _, err := s.svc.CancelOrder(ctx, a.ID, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.svc.Restock(ctx, sku, 2); err != nil {
			t.Fatal(err)
		}
		s.quiet(sku)
		restore()
		// As a restart gives the server a new replication id: the sale's
		// next order checks it against the database first.
		if err := s.rdb.HSet(ctx, "stock:{"+sku+"}:sale", "replid", "an-older-server").Err(); err != nil {
			t.Fatal(err)
		}
		for _, buyer := range []string{"b", "c", "d", "e", "f"} {
			if _, err := s.order(sku, 1, buyer, ""); err != nil {
				t.Fatalf("order of %s after the copy came back: %v (A's returned unit or the restock lost?)", buyer, err)
			}
		}
		if _, err := s.order(sku, 1, "g", ""); !errors.Is(err, inventory.ErrSoldOut) {
			t.Fatalf("a 6th order of 5 units: %v", err)
		}
		if audit := s.quiet(sku); audit.Available != 0 || audit.Orders != 5 || audit.Cancelled != 1 || audit.Restocked != 2 || !audit.Consistent() {
			t.Errorf("at the end: %+v", audit)
		}
	})
}
