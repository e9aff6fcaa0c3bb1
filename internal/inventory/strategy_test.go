package inventory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

// TestCASInFlightBound: with one slot per SKU, a second attempt on the SKU
// waits in the process while the first is in its transaction; if its
// deadline passes first it is busy without having touched the database.
// Another SKU's stripe is not held up.
func TestCASInFlightBound(t *testing.T) {
	cas := inventory.NewVersionCAS(inventory.WithMaxInFlight(1))
	entered := make(chan string, 4)
	release := make(chan struct{})
	var runs int
	holdingRunner := func(ctx context.Context, _ func(context.Context, inventory.Tx) error) error {
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
	neverRuns := func(context.Context, func(context.Context, inventory.Tx) error) error {
		t.Error("an attempt ran past a full gate")
		return nil
	}
	if err := cas.Deduct(cancelled, "hot", 1, neverRuns); !errors.Is(err, inventory.ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Errorf("second attempt on a full gate: %v, want busy and canceled", err)
	}

	other := otherStripe(t, cas, "hot")
	if err := cas.Deduct(context.Background(), other, 1, func(context.Context, func(context.Context, inventory.Tx) error) error {
		return inventory.ErrSoldOut
	}); !errors.Is(err, inventory.ErrSoldOut) {
		t.Errorf("SKU %q on another stripe: %v, want it to run", other, err)
	}

	close(release)
	if err := <-firstDone; !errors.Is(err, inventory.ErrSoldOut) {
		t.Errorf("first attempt: %v", err)
	}
	if err := cas.Deduct(context.Background(), "hot", 1, func(context.Context, func(context.Context, inventory.Tx) error) error {
		return inventory.ErrSoldOut
	}); !errors.Is(err, inventory.ErrSoldOut) {
		t.Errorf("after the slot freed: %v, want the attempt to run", err)
	}
	if runs != 1 {
		t.Errorf("holding runner ran %d times", runs)
	}
}

// otherStripe finds a SKU whose gate is not the one of sku, which must be
// full: an attempt on it runs even with a cancelled context. (On a full gate
// only the cancellation is ready, so a run proves another gate.)
func otherStripe(t *testing.T, cas *inventory.VersionCAS, sku string) string {
	t.Helper()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 1000 {
		candidate := fmt.Sprintf("%s-%d", sku, i)
		ran := false
		_ = cas.Deduct(cancelled, candidate, 1, func(context.Context, func(context.Context, inventory.Tx) error) error {
			ran = true
			return inventory.ErrSoldOut
		})
		if ran {
			return candidate
		}
	}
	t.Fatalf("no SKU found outside the stripe of %q", sku)
	return ""
}
