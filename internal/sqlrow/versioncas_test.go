package sqlrow_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sqlrow"
)

// TestCASInFlightBound: with one slot per SKU, a second attempt on the SKU
// waits in the process while the first is in its transaction; if its
// deadline passes first it is busy without having touched the database.
// Another SKU is not held up: every SKU has a gate of its own.
func TestCASInFlightBound(t *testing.T) {
	cas := sqlrow.NewVersionCAS(sqlrow.WithMaxInFlight(1))
	entered := make(chan string, 4)
	release := make(chan struct{})
	var runs int
	holdingRunner := func(ctx context.Context, _ func(context.Context, inventory.StockTx) error) error {
		runs++
		entered <- "first"
		<-release
		return inventory.ErrSoldOut
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- cas.Deduct(context.Background(), "hot", 1, holdingRunner) }()
	<-entered

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	neverRuns := func(context.Context, func(context.Context, inventory.StockTx) error) error {
		t.Error("an attempt ran past a full gate")
		return nil
	}
	if err := cas.Deduct(cancelled, "hot", 1, neverRuns); !errors.Is(err, inventory.ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Errorf("second attempt on a full gate: %v, want busy and canceled", err)
	}

	for i := range 100 {
		other := fmt.Sprintf("cold-%d", i)
		if err := cas.Deduct(context.Background(), other, 1, func(context.Context, func(context.Context, inventory.StockTx) error) error {
			return inventory.ErrSoldOut
		}); !errors.Is(err, inventory.ErrSoldOut) {
			t.Errorf("SKU %q beside the full one: %v, want it to run", other, err)
		}
	}

	close(release)
	if err := <-firstDone; !errors.Is(err, inventory.ErrSoldOut) {
		t.Errorf("first attempt: %v", err)
	}
	if err := cas.Deduct(context.Background(), "hot", 1, func(context.Context, func(context.Context, inventory.StockTx) error) error {
		return inventory.ErrSoldOut
	}); !errors.Is(err, inventory.ErrSoldOut) {
		t.Errorf("after the slot freed: %v, want the attempt to run", err)
	}
	if runs != 1 {
		t.Errorf("holding runner ran %d times", runs)
	}
}
