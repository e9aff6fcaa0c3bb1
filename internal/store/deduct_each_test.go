package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/batched"
	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// TestDeductEachTakesWhatFitsAnOpenSale: a batch's one statement over
// several SKUs deducts each SKU's total where its sale is open and has
// that much, and leaves the others (too few units, a window not started,
// no row) untouched, on both engines; it returns every row as it read it.
func TestDeductEachTakesWhatFitsAnOpenSale(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.New(t, engine, 4)
			for sku, n := range map[string]int64{"each-a": 5, "each-b": 1} {
				if err := db.StartSale(ctx, sku, n); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.StartSaleWindow(ctx, "each-c", 5, inventory.SaleWindow{StartsAt: time.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			before, _ := db.Level(ctx, "each-b")
			var done []batched.Deduction
			err := db.InBatchTx(ctx, func(ctx context.Context, tx batched.Tx) error {
				var err error
				done, err = tx.DeductEach(ctx, []string{"each-a", "each-b", "each-c", "each-d"}, []int64{2, 2, 1, 1})
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			var fitted []bool
			for _, d := range done {
				fitted = append(fitted, d.Deducted)
			}
			if want := []bool{true, false, false, false}; !slices.Equal(fitted, want) {
				t.Errorf("fitted %v, want %v", fitted, want)
			}
			// Every row comes back as read under its lock, before the
			// deduction, so the batch plans a SKU that did not fit
			// again without reading it again.
			for i, want := range []batched.Deduction{
				{Deducted: true, Exists: true, Level: inventory.Level{Available: 5, Window: inventory.WindowOpen}},
				{Exists: true, Level: inventory.Level{Available: 1, Window: inventory.WindowOpen}},
				{Exists: true, Level: inventory.Level{Available: 5, Window: inventory.WindowNotStarted}},
				{},
			} {
				got := done[i]
				got.Level.Version, got.Level.Fence = 0, 0
				if got != want {
					t.Errorf("row %d: %+v, want %+v", i, got, want)
				}
			}
			if done[1].Level.Version != before.Version {
				t.Errorf("each-b read at version %d, want %d", done[1].Level.Version, before.Version)
			}
			for sku, want := range map[string]int64{"each-a": 3, "each-b": 1, "each-c": 5} {
				if l, err := db.Level(ctx, sku); err != nil || l.Available != want {
					t.Errorf("%s: %+v %v, want %d available", sku, l, err, want)
				}
			}
			if after, _ := db.Level(ctx, "each-b"); after.Version != before.Version {
				t.Errorf("each-b's version moved from %d to %d though nothing was deducted", before.Version, after.Version)
			}
		})
	}
}
