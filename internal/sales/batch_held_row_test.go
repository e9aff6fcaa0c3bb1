package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
)

var errHolderDone = errors.New("the holder let the rows go")

// holdRows locks the rows of skus in a transaction of db's until letGo
// (or the test's end), as a sale start or a paused client would, and
// returns its session, for waitBlockedBy. letGo returns once the
// transaction has rolled back.
func holdRows(t *testing.T, db inventory.Store, skus ...string) (session int64, letGo func()) {
	t.Helper()
	sessions, release := make(chan int64, 1), make(chan struct{})
	holder := async(func() (inventory.Order, int, error) {
		return inventory.Order{}, 0, db.InTx(context.Background(), func(ctx context.Context, tx inventory.Tx) error {
			for _, sku := range skus {
				if _, err := tx.LockLevel(ctx, sku); err != nil {
					return err
				}
			}
			sessions <- sessionOf(ctx, t, tx)
			<-release
			return errHolderDone
		})
	})
	select {
	case session = <-sessions:
	case h := <-holder:
		t.Fatalf("hold the rows of %q: %v", skus, h.err)
	}
	var once sync.Once
	letGo = func() {
		once.Do(func() {
			close(release)
			if h := await(t, holder, "the holder"); !errors.Is(h.err, errHolderDone) {
				t.Errorf("the holder: %v", h.err)
			}
		})
	}
	t.Cleanup(letGo) // a failed test lets the rows go too
	return session, letGo
}

// TestAHeldRowHoldsUpOnlyItsOwnSKUsOrders: every SKU in one lane (the
// default), and another transaction holds the row of "held" (1 unit), as
// a sale start deleting a large sale's orders or a paused client would.
// Buyer 1 orders it: the lane's batch skips the row and moves the order
// to that SKU's own queue, where it waits for the row. Meanwhile an order
// of each of 20 other SKUs is answered 201 (the lane is not held up), and
// buyer 2's order of "held" queues behind buyer 1's. When the row is let
// go, buyer 1 gets the unit and buyer 2 is sold out: arrival order, on
// both engines.
func TestAHeldRowHoldsUpOnlyItsOwnSKUsOrders(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 8)
			queued := make(queueSignal, 64)
			svc := sales.NewService(db, batched.New(db, batched.WithQueueObserver(queued)), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			if err := svc.StartSale(ctx, "held", 1); err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				if err := svc.StartSale(ctx, fmt.Sprintf("free-%02d", i), 5); err != nil {
					t.Fatal(err)
				}
			}

			holder, letGo := holdRows(t, db, "held")

			first := async(func() (inventory.Order, int, error) {
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "held", Quantity: 1, UserID: "first"})
				return o, 0, err
			})
			raw.waitBlockedBy(t, holder, 1) // buyer 1's batch waits for the row

			for i := range 20 {
				sku := fmt.Sprintf("free-%02d", i)
				octx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := svc.PlaceOrder(octx, inventory.Request{SKU: sku, Quantity: 1, UserID: "other"})
				cancel()
				if err != nil {
					t.Fatalf("an order of %s while another SKU's row is held: %v", sku, err)
				}
			}

			for len(queued) > 0 {
				<-queued
			}
			second := async(func() (inventory.Order, int, error) {
				o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "held", Quantity: 1, UserID: "second"})
				return o, 0, err
			})
			<-queued // buyer 2 waits in the process, behind buyer 1
			letGo()
			if r := await(t, first, "buyer 1"); r.err != nil {
				t.Errorf("buyer 1, first in line: %v", r.err)
			}
			if r := await(t, second, "buyer 2"); inventory.Outcome(r.err) != "sold_out" {
				t.Errorf("buyer 2, after buyer 1 took the last unit: %v, want sold out", r.err)
			}
			checkAudit(t, svc, "held", 1)
		})
	}
}

// TestManyHeldRowsDoNotStarveTheLane: one transaction holds the rows of
// ten SKUs (as a catalog's sale start does), and a buyer orders each of
// them through an instance whose pool has 8 connections. Their batches
// wait for their rows a few at a time (batched.DefaultHeldBatches), not
// one connection each, so orders of other SKUs still find a connection
// and are answered 201 while the rows are held; once they are let go,
// every held SKU's order is taken, on both engines. (Found by review: one
// waiting transaction per held SKU took the whole pool.)
func TestManyHeldRowsDoNotStarveTheLane(t *testing.T) {
	const heldSKUs = 10
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db, raw := dbWithRawAccess(t, engine, 8)
			svc := sales.NewService(db, batched.New(db), sales.WithOrderTimeout(30*time.Second))
			ctx := context.Background()
			for i := range heldSKUs {
				if err := svc.StartSale(ctx, fmt.Sprintf("held-%02d", i), 1); err != nil {
					t.Fatal(err)
				}
				if err := svc.StartSale(ctx, fmt.Sprintf("free-%02d", i), 1); err != nil {
					t.Fatal(err)
				}
			}
			var skus []string
			for i := range heldSKUs {
				skus = append(skus, fmt.Sprintf("held-%02d", i))
			}
			holderSession, letGo := holdRows(t, db, skus...)

			var waiting []chan result
			for i := range heldSKUs {
				waiting = append(waiting, async(func() (inventory.Order, int, error) {
					o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: fmt.Sprintf("held-%02d", i), Quantity: 1, UserID: "patient"})
					return o, 0, err
				}))
			}
			raw.waitBlockedBy(t, holderSession, batched.DefaultHeldBatches)

			for i := range heldSKUs {
				octx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := svc.PlaceOrder(octx, inventory.Request{SKU: fmt.Sprintf("free-%02d", i), Quantity: 1, UserID: "other"})
				cancel()
				if err != nil {
					t.Fatalf("an order of free-%02d while %d other rows are held: %v", i, heldSKUs, err)
				}
			}
			letGo()
			for i, w := range waiting {
				if r := await(t, w, "a held SKU's order"); r.err != nil {
					t.Errorf("the order of held-%02d, once its row was let go: %v", i, r.err)
				}
			}
		})
	}
}
