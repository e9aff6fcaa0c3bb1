package reservation_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/strategies"
)

// errMarked stands for the service's refusal by its sold-out mark.
var errMarked = fmt.Errorf("%w (test mark)", inventory.ErrSoldOut)

// switchMark is a sold-out mark the test turns on and off; it counts how
// often it was asked.
type switchMark struct {
	on    atomic.Bool
	asked atomic.Int64
}

func (m *switchMark) Refusal(string, int64) error {
	m.asked.Add(1)
	if m.on.Load() {
		return errMarked
	}
	return nil
}

// TestWatchAsksTheSoldOutMarkBeforeItsRoundTrip (redis-watch): an order
// that waited its turn (the SKU's gate, a lost race's pause) asks the
// instance's sold-out mark again before it reads the sale, and a refusal
// there is its answer, as is, with nothing taken and nothing sent: the
// orders queued in the gate when a sale sells out are refused at once
// instead of each reading it empty in turn. An order without a mark (one
// the mark may not answer) is not asked about.
func TestWatchAsksTheSoldOutMarkBeforeItsRoundTrip(t *testing.T) {
	s := newSaleIn(t, "postgres", modes[1])
	ctx := context.Background()
	s.start("m", 5)
	mark := &switchMark{}
	mark.on.Store(true)
	order := func(id string, m inventory.SoldOutMark) (string, error) {
		taken, err := s.res.Reserve(ctx, reservation.Reservation{Mark: m,
			Order: inventory.Order{ID: id, SKU: "m", Quantity: 1, UserID: "u-" + id, Strategy: strategies.NameRedisWatch}})
		return taken.OrderID, err
	}
	if _, err := order("01000000-0000-7000-8000-000000000001", mark); !errors.Is(err, errMarked) {
		t.Fatalf("an order the mark refuses: %v, want the mark's own refusal", err)
	}
	tally, err := s.res.Tally(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if tally.Available != 5 || tally.Orders != 0 {
		t.Fatalf("after the marked refusal: %+v, want nothing taken", tally)
	}
	mark.on.Store(false)
	if _, err := order("01000000-0000-7000-8000-000000000002", mark); err != nil {
		t.Fatalf("an order the mark lets through: %v", err)
	}
	asked := mark.asked.Load()
	if _, err := order("01000000-0000-7000-8000-000000000003", nil); err != nil {
		t.Fatalf("an order without a mark: %v", err)
	}
	if tally, err = s.res.Tally(ctx, "m"); err != nil || tally.Available != 3 || tally.Orders != 2 {
		t.Fatalf("after two orders taken: %+v, %v", tally, err)
	}
	if asked != 2 || mark.asked.Load() != asked {
		t.Fatalf("the mark was asked %d times, then %d; want once per order that carried it", asked, mark.asked.Load())
	}
}
