package sales_test

// The promise at the edges, on every strategy and both engines: admin
// writes a retry cannot double, one buyer whatever the engine, a count
// that never falls below what its orders claimed, order ids that match in
// either case, and a held order's expiry in its answer.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// loseCommitAnswer is a store whose armed transactions commit and then
// answer ErrOutcomeUnknown, as a connection reset after COMMIT does.
type loseCommitAnswer struct {
	store.Store
	armed atomic.Int32
}

func (s *loseCommitAnswer) InTx(ctx context.Context, fn func(context.Context, inventory.Tx) error) error {
	err := s.Store.InTx(ctx, fn)
	if err == nil && s.armed.Add(-1) >= 0 {
		return fmt.Errorf("%w: connection reset after COMMIT (test)", inventory.ErrOutcomeUnknown)
	}
	return err
}

// TestEdgesOnEveryStrategy runs the checks of the API's edges on every
// strategy of the registry, on both engines.
func TestEdgesOnEveryStrategy(t *testing.T) {
	for _, engine := range store.Engines {
		for _, name := range strategies.Names() {
			build := builders()[name]
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := &loseCommitAnswer{Store: testdb.New(t, engine, 8)}
				strategy := build(t, engine, db.Store)
				opts := []sales.ServiceOption{sales.WithOrderTimeout(20 * time.Second), sales.WithHoldTTL(time.Hour)}
				free := sales.NewService(db, strategy, opts...)
				limited := sales.NewService(db, strategy, append(opts, sales.WithPerUserLimit(3))...)
				t.Run("a retried restock adds once", func(t *testing.T) { retriedRestockAddsOnce(t, free, db) })
				t.Run("a retried start starts once", func(t *testing.T) { retriedStartStartsOnce(t, free) })
				t.Run("look-alike buyer ids are refused", func(t *testing.T) { lookAlikeBuyersAreRefused(t, limited) })
				t.Run("a count never falls below its orders' claims", func(t *testing.T) { countKeepsItsOrdersClaims(t, free, limited) })
				t.Run("an order id matches in either case", func(t *testing.T) { orderIDMatchesInEitherCase(t, free) })
				t.Run("a held order's answer carries its expiry", func(t *testing.T) { heldOrderAnswerCarriesItsExpiry(t, free) })
			})
		}
	}
}

// retriedRestockAddsOnce: a restock retried with its key, whatever became
// of the first answer (returned, or its commit answer lost), adds its
// units once; the same key with another quantity is refused; the audit
// lists the restock once, with its key.
func retriedRestockAddsOnce(t *testing.T, svc *sales.Service, db *loseCommitAnswer) {
	ctx := context.Background()
	if err := svc.StartSale(ctx, "restock", 10); err != nil {
		t.Fatal(err)
	}
	first, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "restock", Quantity: 5, IdempotencyKey: "r-1"})
	if err != nil || first.Replayed {
		t.Fatalf("the first restock: %+v %v", first, err)
	}
	again, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "restock", Quantity: 5, IdempotencyKey: "r-1"})
	if err != nil || !again.Replayed || again.Restock.ID != first.Restock.ID {
		t.Fatalf("its retry: %+v %v, want the first restock replayed", again, err)
	}
	if _, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "restock", Quantity: 6, IdempotencyKey: "r-1"}); !errors.Is(err, inventory.ErrIdempotencyConflict) {
		t.Fatalf("the key with another quantity: %v, want idempotency conflict", err)
	}
	// A restock whose commit answer is lost: resolved before it is
	// answered, and its retry adds nothing.
	db.armed.Store(1)
	lost, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "restock", Quantity: 7, IdempotencyKey: "r-2"})
	if err != nil {
		t.Fatalf("a restock whose commit answer was lost: %v, want it found and answered", err)
	}
	retry, err := svc.RestockSale(ctx, inventory.RestockRequest{SKU: "restock", Quantity: 7, IdempotencyKey: "r-2"})
	if err != nil || !retry.Replayed || retry.Restock.ID != lost.Restock.ID {
		t.Fatalf("its retry: %+v %v, want the first replayed", retry, err)
	}
	a := auditSettled(t, svc, "restock")
	if a.Restocked != 12 || a.Available != 22 || !a.Consistent() {
		t.Errorf("after restocks of 5 and 7, each sent twice: %+v, want 12 restocked and 22 available", a)
	}
	var keys []string
	for _, r := range a.Restocks {
		keys = append(keys, r.Key)
	}
	if !slices.Equal(keys, []string{"r-1", "r-2"}) {
		t.Errorf("the audit lists the restocks with keys %q, want each once", keys)
	}
}

// retriedStartStartsOnce: a start retried with its key after orders were
// taken in the sale it started answers the first start and keeps them.
func retriedStartStartsOnce(t *testing.T, svc *sales.Service) {
	ctx := context.Background()
	req := inventory.SaleRequest{SKU: "start", Available: 4, IdempotencyKey: "s-1"}
	if started, err := svc.OpenSale(ctx, req); err != nil || started.Replayed {
		t.Fatalf("the start: %+v %v", started, err)
	}
	o := place(t, svc, "start", "u-1", 1)
	started, err := svc.OpenSale(ctx, req)
	if err != nil || !started.Replayed {
		t.Fatalf("its retry: %+v %v, want the first start replayed", started, err)
	}
	if found, err := svc.FindOrder(ctx, o.ID, "u-1"); err != nil || found.ID != o.ID {
		t.Errorf("the order taken before the retry: %v, want it kept", err)
	}
	if _, err := svc.OpenSale(ctx, inventory.SaleRequest{SKU: "start", Available: 5, IdempotencyKey: "s-1"}); !errors.Is(err, inventory.ErrIdempotencyConflict) {
		t.Errorf("the key with another body: %v, want idempotency conflict", err)
	}
	if a := auditSettled(t, svc, "start"); a.Orders != 1 || a.Available != 3 {
		t.Errorf("after the retried start: %+v, want the order kept and 3 left", a)
	}
}

// lookAlikeBuyersAreRefused: "alice", "alice " and " alice" are one buyer
// on MariaDB (its collation pads with spaces) and three on PostgreSQL and
// Redis; the service refuses the spellings with a space at either end, so
// no store sees them and no other buyer's order fails for them.
func lookAlikeBuyersAreRefused(t *testing.T, svc *sales.Service) {
	ctx := context.Background()
	if err := svc.StartSale(ctx, "alike", 20); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"alice ", " alice", "alice  ", " "} {
		if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "alike", Quantity: 1, UserID: id}); !errors.Is(err, inventory.ErrInvalid) {
			t.Errorf("user_id %q: %v, want invalid", id, err)
		}
	}
	for _, id := range []string{"alice", "al ice", "bob"} {
		if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "alike", Quantity: 3, UserID: id}); err != nil {
			t.Errorf("user_id %q: %v", id, err)
		}
	}
	if a := auditSettled(t, svc, "alike"); a.Orders != 3 || a.Ordered != 9 {
		t.Errorf("%+v: want three buyers' orders of 3", a)
	}
}

// countKeepsItsOrdersClaims: an instance without a limit takes an order
// that claims nothing on the buyer's count; its cancel through an
// instance with a limit gives nothing back, so the count still covers the
// order that did claim, and the limit holds (before, the cancel gave back
// units it never claimed and GREATEST(…, 0) hid the count going below
// what the buyer held: the buyer then took the limit again).
func countKeepsItsOrdersClaims(t *testing.T, free, limited *sales.Service) {
	ctx := context.Background()
	if err := limited.StartSale(ctx, "claims", 20); err != nil {
		t.Fatal(err)
	}
	unclaimed := place(t, free, "claims", "carol", 2)
	place(t, limited, "claims", "carol", 2)
	if _, err := limited.CancelOrder(ctx, unclaimed.ID, "carol"); err != nil {
		t.Fatalf("cancel the order taken without a limit: %v", err)
	}
	_, err := limited.PlaceOrder(ctx, inventory.Request{SKU: "claims", Quantity: 2, UserID: "carol"})
	if !errors.Is(err, inventory.ErrLimitReached) {
		t.Errorf("carol holds 2 counted units and asks 2 more under a limit of 3: %v, want limit reached", err)
	}
	if _, err := limited.PlaceOrder(ctx, inventory.Request{SKU: "claims", Quantity: 1, UserID: "carol"}); err != nil {
		t.Errorf("carol's third unit: %v", err)
	}
}

// orderIDMatchesInEitherCase: an id in upper case finds the order on both
// engines (PostgreSQL's uuid matched it, MariaDB's binary CHAR(36) did
// not), and the answer gives it as the service wrote it.
func orderIDMatchesInEitherCase(t *testing.T, svc *sales.Service) {
	ctx := context.Background()
	if err := svc.StartSale(ctx, "case", 2); err != nil {
		t.Fatal(err)
	}
	o := place(t, svc, "case", "dave", 1)
	found, err := svc.FindOrder(ctx, strings.ToUpper(o.ID), "dave")
	if err != nil || found.ID != o.ID {
		t.Errorf("the order by its id in upper case: %+v %v", found, err)
	}
	if _, err := svc.CancelOrder(ctx, strings.ToUpper(o.ID), "dave"); err != nil {
		t.Errorf("cancel by the id in upper case: %v", err)
	}
}

// heldOrderAnswerCarriesItsExpiry: a held order's answer says when its
// hold lapses: the very expiry the order is read back with, or for the
// reservation strategies (whose orders the database records a moment
// after their 201, the hold running from then) a promise the recorded
// expiry never comes before.
func heldOrderAnswerCarriesItsExpiry(t *testing.T, svc *sales.Service) {
	ctx := context.Background()
	if err := svc.StartSale(ctx, "expiry", 2); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	o := place(t, svc, "expiry", "erin", 1)
	if o.ExpiresAt.IsZero() {
		t.Fatalf("a held order's answer has no expiry: %+v", o)
	}
	if d := o.ExpiresAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("expires %v after the order, want about the hold (1h)", d)
	}
	found, err := svc.FindOrder(ctx, o.ID, "erin")
	if err != nil {
		t.Fatal(err)
	}
	if reserved := slices.Contains(strategies.ReservedNames, o.Strategy); reserved {
		if found.ExpiresAt.Before(o.ExpiresAt) || found.ExpiresAt.Sub(o.ExpiresAt) > 10*time.Second {
			t.Errorf("read back %v, answered %v: want the answer's promise kept, a moment later at most", found.ExpiresAt, o.ExpiresAt)
		}
	} else if !found.ExpiresAt.Equal(o.ExpiresAt) {
		t.Errorf("read back %v, answered %v", found.ExpiresAt, o.ExpiresAt)
	}
}

// auditSettled audits the SKU once the strategy's own books and the
// database agree (the reservation strategies write their orders a moment
// after their 201s).
func auditSettled(t *testing.T, svc *sales.Service, sku string) inventory.Audit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		a, err := svc.Audit(ctx, sku)
		if err == nil && a.Pending == 0 && a.Relaying == 0 {
			return a
		}
		select {
		case <-ctx.Done():
			t.Fatalf("audit of %s: %+v %v", sku, a, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
