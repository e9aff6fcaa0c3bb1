package sales_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// heldStart is a store whose starts wait for release before they reach
// the database (a start on its way), after saying so on started.
type heldStart struct {
	store.Store
	started chan struct{}
	release chan struct{}
}

func (s *heldStart) StartSaleWith(ctx context.Context, st inventory.SaleStart) (int64, error) {
	s.started <- struct{}{}
	<-s.release
	return s.Store.StartSaleWith(ctx, st)
}

// TestSaleStartLiftsTheMarkAfterItLands: an order the old sale refuses
// while a new sale's start is on its way must not leave a mark on the new
// sale. The start lifts the instance's sold-out mark once it is over;
// were the mark lifted before the start, that order would ask the store,
// be refused by the old sale and mark the SKU again, and the instance
// that started the new sale would refuse its first orders as sold out for
// up to SOLD_OUT_TTL.
func TestSaleStartLiftsTheMarkAfterItLands(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := &heldStart{Store: testdb.New(t, engine, 4), started: make(chan struct{}, 1), release: make(chan struct{})}
			clock := &handClock{t: time.Unix(1_000_000, 0)}
			svc := sales.NewService(db, sqlrow.NewConditional(), sales.WithClock(clock.now), sales.WithSoldOutTTL(time.Second))
			go func() { <-db.started; db.release <- struct{}{} }()
			if err := svc.StartSale(ctx, "s", 1); err != nil {
				t.Fatal(err)
			}
			clock.step(time.Millisecond)
			if _, err := order(t, svc, "s", "u1", ""); err != nil {
				t.Fatalf("the old sale's only unit: %v", err)
			}
			clock.step(time.Millisecond)
			if _, err := order(t, svc, "s", "u2", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("past the old sale's stock: %v, want sold out", err)
			}
			started := make(chan error, 1)
			go func() { started <- svc.StartSale(ctx, "s", 5) }()
			<-db.started // the new sale's start is on its way
			// Later than anything the start did so far: a refusal now is
			// an observation the mark would keep.
			clock.step(time.Millisecond)
			if _, err := order(t, svc, "s", "u3", ""); !errors.Is(err, inventory.ErrSoldOut) {
				t.Fatalf("an order of the old sale while the start is on its way: %v, want sold out", err)
			}
			db.release <- struct{}{}
			if err := <-started; err != nil {
				t.Fatal(err)
			}
			// The same instant on the instance's clock: only a mark left
			// by the order above would refuse this.
			if _, err := order(t, svc, "s", "u4", ""); err != nil {
				t.Errorf("the new sale's first order through the instance that started it: %v, want 201", err)
			}
		})
	}
}
