package sales_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/lab/testdb"
)

// TestCatalogStartPutsEverySKUOnSale: on every strategy and both engines,
// one catalog request puts each of its SKUs on sale as a start of one
// does: its units, its window, its older orders forgotten (and the sold-out
// mark of the older sale lifted). A retry with the same key, its rows in
// another order, starts nothing again (the orders since are kept); the key
// with another body is refused; a request with a bad row starts none of
// its SKUs.
func TestCatalogStartPutsEverySKUOnSale(t *testing.T) {
	const skus = 40
	for _, engine := range store.Engines {
		for name, build := range builders() {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 8)
				svc := sales.NewService(db, build(t, engine, db), sales.WithOrderTimeout(30*time.Second))
				ctx := context.Background()
				order := func(sku, user string) error {
					_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: user})
					return err
				}
				// An older sale of the first SKU, sold out: its order is
				// forgotten by the catalog's start, and its mark lifted.
				if err := svc.StartSale(ctx, "cat-00", 1); err != nil {
					t.Fatalf("start: %v", err)
				}
				if err := order("cat-00", "old"); err != nil {
					t.Fatalf("order in the older sale: %v", err)
				}
				if err := order("cat-00", "old"); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("the older sale sold out: %v", err)
				}

				req := inventory.CatalogRequest{IdempotencyKey: "catalog-1"}
				for i := range skus {
					req.Sales = append(req.Sales, inventory.SaleRequest{SKU: fmt.Sprintf("cat-%02d", i), Available: int64(i%5 + 1)})
				}
				later := inventory.SaleRequest{SKU: "cat-later", Available: 3, Window: inventory.SaleWindow{StartsAt: time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)}}
				req.Sales = append(req.Sales, later)
				started, err := svc.OpenCatalog(ctx, req)
				if err != nil || started.SKUs != skus+1 || started.Replayed {
					t.Fatalf("catalog: %+v %v", started, err)
				}
				for _, s := range req.Sales[:skus] {
					if err := order(s.SKU, "u"); err != nil {
						t.Fatalf("order of %s: %v", s.SKU, err)
					}
				}
				if err := order(later.SKU, "u"); !errors.Is(err, inventory.ErrSaleNotStarted) {
					t.Errorf("an order before the window: %v, want not started", err)
				}
				check := func(when string) {
					t.Helper()
					for _, s := range req.Sales[:skus] {
						a, err := svc.Audit(ctx, s.SKU)
						if err != nil {
							t.Fatalf("%s: audit %s: %v", when, s.SKU, err)
						}
						if a.Initial != s.Available || a.Orders != 1 || a.Available != s.Available-1 || !a.Consistent() {
							t.Errorf("%s: audit of %s %+v, want %d units and the one order of the new sale", when, s.SKU, a, s.Available)
						}
					}
				}
				check("after the start")

				retry := inventory.CatalogRequest{IdempotencyKey: req.IdempotencyKey, Sales: slices.Clone(req.Sales)}
				slices.Reverse(retry.Sales)
				again, err := svc.OpenCatalog(ctx, retry)
				if err != nil || !again.Replayed || again.SKUs != skus+1 {
					t.Fatalf("the retry: %+v %v, want replayed", again, err)
				}
				check("after the retry")

				other := inventory.CatalogRequest{IdempotencyKey: req.IdempotencyKey, Sales: slices.Clone(req.Sales)}
				other.Sales[3].Available++
				if _, err := svc.OpenCatalog(ctx, other); !errors.Is(err, inventory.ErrIdempotencyConflict) {
					t.Errorf("the key with another row: %v, want an idempotency conflict", err)
				}

				bad := inventory.CatalogRequest{Sales: []inventory.SaleRequest{{SKU: "cat-new", Available: 5}, {SKU: "cat-01", Available: 9}, {SKU: "cat-new", Available: 2}}}
				if _, err := svc.OpenCatalog(ctx, bad); !errors.Is(err, inventory.ErrInvalid) {
					t.Errorf("a SKU twice: %v, want invalid", err)
				}
				if _, err := db.Audit(ctx, "cat-new"); !errors.Is(err, inventory.ErrUnknownSKU) {
					t.Errorf("a request refused for a bad row started cat-new: %v", err)
				}
				check("after the refused request")
			})
		}
	}
}

// TestCatalogRequestNamesItsBadRow: a bad row is refused by its index and
// SKU, whatever rule it breaks.
func TestCatalogRequestNamesItsBadRow(t *testing.T) {
	ok := inventory.SaleRequest{SKU: "a", Available: 1}
	cases := []struct {
		name string
		rows []inventory.SaleRequest
		want string
	}{
		{"no rows", nil, "names no SKU"},
		{"a SKU twice", []inventory.SaleRequest{ok, {SKU: "b", Available: 1}, ok}, `row 2 (sku "a"): the SKU is row 0 already`},
		{"a bad SKU", []inventory.SaleRequest{ok, {SKU: "b c", Available: 1}}, `row 1 (sku "b c"): sku`},
		{"too many units", []inventory.SaleRequest{ok, {SKU: "b", Available: inventory.MaxInitialStock + 1}}, `row 1 (sku "b"): available`},
		{"a window that ends first", []inventory.SaleRequest{{SKU: "w", Available: 1, Window: inventory.SaleWindow{StartsAt: time.Unix(200, 0), EndsAt: time.Unix(100, 0)}}}, `row 0 (sku "w")`},
		{"too many SKUs", make([]inventory.SaleRequest, inventory.MaxCatalogSKUs+1), "more than 10000"},
	}
	for _, c := range cases {
		err := inventory.CatalogRequest{Sales: c.rows}.Validate()
		if !errors.Is(err, inventory.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want invalid with %q", c.name, err, c.want)
		}
	}
	if a, b := (inventory.CatalogRequest{Sales: []inventory.SaleRequest{ok, {SKU: "b", Available: 2}}}).Fingerprint(),
		(inventory.CatalogRequest{Sales: []inventory.SaleRequest{{SKU: "b", Available: 2}, ok}}).Fingerprint(); string(a) != string(b) {
		t.Error("the same rows in another order fingerprint differently")
	}
}

// conflictCounter counts the transactions the service ran again after a
// deadlock or serialization failure.
type conflictCounter struct {
	inventory.NopObserver
	conflicts atomic.Int64
}

func (c *conflictCounter) Retried(_, reason string) {
	if reason == "conflict" {
		c.conflicts.Add(1)
	}
}

// TestCatalogStartsSharingSKUsQueueInsteadOfDeadlocking: catalogs that
// share their SKUs, each listing them in another order, started at once
// through two services on both engines: every one succeeds, and none of
// them is chosen as a deadlock victim, because the rows are taken in
// SKU order whatever the request's order.
func TestCatalogStartsSharingSKUsQueueInsteadOfDeadlocking(t *testing.T) {
	const skus, catalogs = 300, 6
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db := testdb.New(t, engine, 16)
			var seen conflictCounter
			svcs := []*sales.Service{
				sales.NewService(db, sqlrow.NewConditional(), sales.WithObserver(&seen), sales.WithTxAttempts(1)),
				sales.NewService(db, sqlrow.NewConditional(), sales.WithObserver(&seen), sales.WithTxAttempts(1)),
			}
			base := make([]inventory.SaleRequest, skus)
			for i := range base {
				base[i] = inventory.SaleRequest{SKU: fmt.Sprintf("share-%03d", i), Available: 5}
			}
			var wg sync.WaitGroup
			errs := make([]error, catalogs)
			for c := range catalogs {
				rows := slices.Clone(base)
				rand.New(rand.NewPCG(uint64(c), 7)).Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
				wg.Go(func() {
					_, errs[c] = svcs[c%2].OpenCatalog(context.Background(), inventory.CatalogRequest{Sales: rows})
				})
			}
			wg.Wait()
			for c, err := range errs {
				if err != nil {
					t.Errorf("catalog %d: %v", c, err)
				}
			}
			if n := seen.conflicts.Load(); n > 0 {
				t.Errorf("%d catalog starts were deadlock victims", n)
			}
		})
	}
}
