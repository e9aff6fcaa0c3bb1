package sales_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/sqlrow"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
)

// lifecycleStrategies are the strategies that take holds: every one. (The
// reservation strategies' returns are decided in the database and relayed
// to Redis: inventory.ReturnRelay.)
func lifecycleStrategies() map[string]builder { return builders() }

// quietAudit is the SKU's audit once nothing is in flight (10 s at most):
// the reservation strategies answer an order before their stream writes it
// to the database, and a return before their relay gives it back to Redis
// (when the relay right after the commit failed, the sweep's does); the
// other strategies are quiet at once.
func quietAudit(t *testing.T, svc *sales.Service, sku string) inventory.Audit {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a, err := svc.Audit(context.Background(), sku)
		if err == nil && a.Pending == 0 && a.Relaying == 0 && (a.Written == nil || a.Written.Orders == a.Orders) {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s the audit of %s still has orders or returns in flight: %+v, %v", sku, a, err)
		}
		// What the service's sweep does every HOLD_SWEEP_EVERY: a relay
		// that failed after its commit (the store slow or busy on a loaded
		// machine: a failure only delays the units, by design) left its
		// returns marked for the sweep to relay (a CI flake before).
		_, _ = svc.ExpireHolds(context.Background(), 0)
		time.Sleep(20 * time.Millisecond) // polling the stream's and the relay's progress
	}
}

// forEachHoldingStrategy runs test, in parallel, for every safe strategy
// that takes holds on both engines, each over a fresh database of its own
// (16 connections).
func forEachHoldingStrategy(t *testing.T, test func(t *testing.T, engine, name string, db store.Store, build builder)) {
	for _, engine := range store.Engines {
		for name, build := range lifecycleStrategies() {
			if strategies.IsControl(name) {
				continue
			}
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				test(t, engine, name, testdb.New(t, engine, 16), build)
			})
		}
	}
}

// TestLifecycleConformance: on every strategy that takes holds and both
// engines, 20 units are held by 20 of 40 racing buyers; then 10 holders
// cancel, each twice at once (a retried cancel on a second instance), 5
// pay, and 20 more buyers race the returns. Every cancel answers
// cancelled, every pay paid, no unit comes back twice, and the units that
// came back are sold again: at the end nothing is left and the books
// balance (initial = available + held + paid).
func TestLifecycleConformance(t *testing.T) {
	const initial = 20
	forEachHoldingStrategy(t, func(t *testing.T, engine, name string, db store.Store, build builder) {
		svc := sales.NewService(db, build(t, engine, db), sales.WithOrderTimeout(30*time.Second),
			sales.WithHoldTTL(time.Hour))
		ctx := context.Background()
		sku := "life-" + name
		if err := svc.StartSale(ctx, sku, initial); err != nil {
			t.Fatalf("start sale: %v", err)
		}
		first := placeOnes(t, svc, sku, "first", 40)
		held := heldOrders(t, first, initial)

		var wg sync.WaitGroup
		cancels := make([]error, 20)
		for i, o := range held[:10] {
			for j := range 2 {
				wg.Go(func() {
					got, err := svc.CancelOrder(ctx, o.ID, o.UserID)
					if err == nil && got.State != inventory.OrderCancelled {
						err = fmt.Errorf("answered state %q", got.State)
					}
					cancels[2*i+j] = err
				})
			}
		}
		pays := make([]error, 5)
		for i, o := range held[10:15] {
			wg.Go(func() {
				got, err := svc.PayOrder(ctx, o.ID, o.UserID)
				if err == nil && got.State != inventory.OrderPaid {
					err = fmt.Errorf("answered state %q", got.State)
				}
				pays[i] = err
			})
		}
		var second []outcome
		wg.Go(func() { second = placeOnes(t, svc, sku, "second", 20) })
		wg.Wait()
		for i, err := range cancels {
			if err != nil {
				t.Errorf("cancel %d of order %s: %v", i%2, held[i/2].ID, err)
			}
		}
		for i, err := range pays {
			if err != nil {
				t.Errorf("pay of order %s: %v", held[10+i].ID, err)
			}
		}
		// What the race with the returns did not sell, buyers who
		// come after it do: every returned unit is for sale.
		third := placeOnes(t, svc, sku, "third", 20)

		a := quietAudit(t, svc, sku)
		sold := int64(0)
		for _, r := range slices.Concat(first, second, third) {
			switch {
			case r.err == nil:
				sold++
			case !errors.Is(r.err, inventory.ErrSoldOut):
				t.Errorf("an order answered %v", r.err)
			}
		}
		t.Logf("audit %+v; %d orders placed", a, sold)
		if !a.Consistent() || a.Available != 0 || a.Held+a.Paid != initial || a.Paid != 5 ||
			a.Cancelled != 10 || a.Returned != 10 || sold != initial+10 || a.Orders != initial {
			t.Errorf("audit %+v after %d orders placed: want every unit held or paid (5 paid), 10 cancelled orders whose 10 units came back once and were sold again", a, sold)
		}
	})
}

// placeOnes has n buyers named prefix-i order one unit of sku at once.
func placeOnes(t *testing.T, svc *sales.Service, sku, prefix string, n int) []outcome {
	t.Helper()
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			o, err := svc.PlaceOrder(context.Background(), inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("%s-%d", prefix, i)})
			out[i] = outcome{quantity: 1, order: o, err: err}
		})
	}
	wg.Wait()
	return out
}

// heldOrders returns the orders of the outcomes, checking that exactly want
// were placed, each held.
func heldOrders(t *testing.T, outs []outcome, want int) []inventory.Order {
	t.Helper()
	var held []inventory.Order
	for _, r := range outs {
		switch {
		case r.err == nil && r.order.State == inventory.OrderHeld:
			held = append(held, r.order)
		case r.err == nil:
			t.Fatalf("a new order with a hold is %q, want held", r.order.State)
		case !errors.Is(r.err, inventory.ErrSoldOut):
			t.Fatalf("an order answered %v", r.err)
		}
	}
	if len(held) != want {
		t.Fatalf("%d orders held, want %d", len(held), want)
	}
	return held
}

// TestLapsedHoldsComeBackOnce: holds of a short TTL lapse (the expiry
// itself is under test, so the test waits for it). A read of a lapsed hold
// expires it on the spot, a pay after the lapse is told expired, the sweep
// expires the rest, a second sweep finds nothing, and every unit is back
// once and sells again (for the reservation strategies, in Redis: the
// relay gives the units back).
func TestLapsedHoldsComeBackOnce(t *testing.T) {
	const hold = 300 * time.Millisecond
	for _, engine := range store.Engines {
		// A strategy that deducts in its statement, one that batches, and
		// the two whose returns are relayed to Redis.
		for _, name := range []string{strategies.NameConditional, strategies.NameBatched, strategies.NameRedisReserve, strategies.NameRedisWatch} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 8)
				svc := sales.NewService(db, builders()[name](t, engine, db), sales.WithHoldTTL(hold))
				ctx := context.Background()
				const sku = "lapse"
				if err := svc.StartSale(ctx, sku, 3); err != nil {
					t.Fatal(err)
				}
				var orders []inventory.Order
				for _, u := range []string{"a", "b", "c"} {
					o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: u})
					if err != nil {
						t.Fatal(err)
					}
					orders = append(orders, o)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "d"}); !errors.Is(err, inventory.ErrSoldOut) {
					t.Fatalf("a fourth order while three are held: %v, want sold out", err)
				}
				a, err := svc.FindOrder(ctx, orders[0].ID, "a")
				if err != nil || a.State != inventory.OrderHeld || a.ExpiresAt.IsZero() {
					t.Fatalf("a fresh hold reads %+v, %v", a, err)
				}
				// The database set expires_at; this machine's clock is the
				// database's, so waiting until then (and a little) lets it
				// lapse.
				time.Sleep(time.Until(a.ExpiresAt) + 50*time.Millisecond)

				if a, err = svc.FindOrder(ctx, orders[0].ID, "a"); err != nil || a.State != inventory.OrderExpired {
					t.Errorf("a lapsed hold reads %+v, %v; want expired", a, err)
				}
				if _, err := svc.PayOrder(ctx, orders[1].ID, "b"); !errors.Is(err, inventory.ErrOrderExpired) {
					t.Errorf("a pay after the lapse: %v, want expired", err)
				}
				if _, err := svc.CancelOrder(ctx, orders[1].ID, "b"); !errors.Is(err, inventory.ErrOrderExpired) {
					t.Errorf("a cancel of an expired order: %v, want expired", err)
				}
				if n, err := svc.ExpireHolds(ctx, 0); err != nil || n != 1 {
					t.Errorf("the sweep expired %d (%v), want the one hold nobody read", n, err)
				}
				if n, err := svc.ExpireHolds(ctx, 0); err != nil || n != 0 {
					t.Errorf("a second sweep expired %d (%v), want none", n, err)
				}
				audit := quietAudit(t, svc, sku)
				if !audit.Consistent() || audit.Available != 3 || audit.Expired != 3 || audit.Returned != 3 || audit.Held != 0 {
					t.Errorf("audit %+v: want the 3 units back once, 3 orders expired", audit)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 3, UserID: "d"}); err != nil {
					t.Errorf("the returned units do not sell: %v", err)
				}
			})
		}
	}
}

// TestFinalOrdersCannotBeSettled: without a hold an order is final; pay
// and cancel say so and change nothing.
func TestFinalOrdersCannotBeSettled(t *testing.T) {
	for _, engine := range store.Engines {
		t.Run(engine, func(t *testing.T) {
			db := testdb.New(t, engine, 4)
			svc := sales.NewService(db, sqlrow.NewConditional())
			ctx := context.Background()
			if err := svc.StartSale(ctx, "f", 2); err != nil {
				t.Fatal(err)
			}
			o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "f", Quantity: 1, UserID: "u"})
			if err != nil || o.State != inventory.OrderFinal {
				t.Fatalf("order %+v, %v: want final", o, err)
			}
			if _, err := svc.PayOrder(ctx, o.ID, "u"); !errors.Is(err, inventory.ErrOrderFinal) {
				t.Errorf("pay of a final order: %v", err)
			}
			if _, err := svc.CancelOrder(ctx, o.ID, "u"); !errors.Is(err, inventory.ErrOrderFinal) {
				t.Errorf("cancel of a final order: %v", err)
			}
			if _, err := svc.CancelOrder(ctx, o.ID, "someone-else"); !errors.Is(err, inventory.ErrOrderNotFound) {
				t.Errorf("cancel by another buyer: %v", err)
			}
			if n, err := svc.ExpireHolds(ctx, 0); err != nil || n != 0 {
				t.Errorf("the sweep expired %d final orders (%v)", n, err)
			}
			if a := quietAudit(t, svc, "f"); a.Available != 1 || a.Paid != 1 || !a.Consistent() {
				t.Errorf("audit %+v", a)
			}
		})
	}
}

// TestPerUserLimitAcrossInstances: with PER_USER_LIMIT=1 on every strategy
// that takes holds and both engines, 20 buyers each send two orders at
// once, one to each of two instances: each buyer gets exactly one unit,
// the other order 409 limit_reached with nothing taken. A buyer who
// cancels may buy again, once; an order bigger than the limit is refused
// outright.
func TestPerUserLimitAcrossInstances(t *testing.T) {
	const buyers = 20
	forEachHoldingStrategy(t, func(t *testing.T, engine, name string, db store.Store, build builder) {
		strategy := build(t, engine, db)
		var instances [2]*sales.Service
		for i := range instances {
			if i > 0 && name == strategies.NameBatched {
				// A batcher of its own: the two orders of a buyer
				// then race in two transactions, as on two
				// instances. (A lock strategy shares its lock
				// server, so it shares the strategy here.)
				strategy = build(t, engine, db)
			}
			instances[i] = sales.NewService(db, strategy, sales.WithOrderTimeout(30*time.Second),
				sales.WithHoldTTL(time.Hour), sales.WithPerUserLimit(1))
		}
		ctx := context.Background()
		sku := "limit-" + name
		if err := instances[0].StartSale(ctx, sku, 100); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			order inventory.Order
			err   error
		}
		answers := make([][2]answer, buyers)
		var wg sync.WaitGroup
		for b := range buyers {
			for i, svc := range instances {
				wg.Go(func() {
					o, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("buyer-%d", b)})
					answers[b][i] = answer{o, err}
				})
			}
		}
		wg.Wait()
		var won []inventory.Order
		for b, pair := range answers {
			ok, limited := 0, 0
			for _, a := range pair {
				switch {
				case a.err == nil:
					ok++
					won = append(won, a.order)
				case errors.Is(a.err, inventory.ErrLimitReached):
					limited++
				default:
					t.Errorf("buyer %d: %v", b, a.err)
				}
			}
			if ok != 1 || limited != 1 {
				t.Errorf("buyer %d: %d orders taken and %d refused for the limit, want 1 and 1", b, ok, limited)
			}
		}
		if len(won) == 0 {
			t.FailNow()
		}
		o := won[0]
		if _, err := instances[1].CancelOrder(ctx, o.ID, o.UserID); err != nil {
			t.Fatalf("cancel: %v", err)
		}
		if _, err := instances[1].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: o.UserID}); err != nil {
			t.Errorf("an order after the buyer cancelled: %v", err)
		}
		if _, err := instances[0].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: o.UserID}); !errors.Is(err, inventory.ErrLimitReached) {
			t.Errorf("a third order of the buyer: %v, want limit reached", err)
		}
		if _, err := instances[0].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 2, UserID: "newcomer"}); !errors.Is(err, inventory.ErrLimitReached) {
			t.Errorf("an order of 2 under a limit of 1: %v, want limit reached", err)
		}
		a := quietAudit(t, instances[0], sku)
		if !a.Consistent() || a.Orders != buyers || a.Held != buyers || a.Returned != 1 {
			t.Errorf("audit %+v: want %d orders held, one cancelled", a, buyers)
		}
	})
}

// TestRestockAddsUnitsAndKeepsOrders: a restock adds units to the sale in
// progress, its orders kept; the audit counts it; the units sell, and no
// more; a SKU with no sale and a bad quantity are refused with nothing
// changed.
func TestRestockAddsUnitsAndKeepsOrders(t *testing.T) {
	for _, engine := range store.Engines {
		// A strategy that counts the stock in the database, and the two
		// that count it in Redis (the restock reaches it through the
		// relay).
		for _, name := range []string{strategies.NameConditional, strategies.NameRedisReserve, strategies.NameRedisWatch} {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 4)
				svc := sales.NewService(db, builders()[name](t, engine, db), sales.WithHoldTTL(time.Hour))
				ctx := context.Background()
				if err := svc.StartSale(ctx, "r", 1); err != nil {
					t.Fatal(err)
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "r", Quantity: 1, UserID: "u"}); err != nil {
					t.Fatal(err)
				}
				level, err := svc.Restock(ctx, "r", 4)
				if err != nil || level.Available != 4 {
					t.Fatalf("restock: %+v, %v", level, err)
				}
				if _, err := svc.Restock(ctx, "nothing-on-sale", 4); !errors.Is(err, inventory.ErrUnknownSKU) {
					t.Errorf("restock of a SKU with no sale: %v", err)
				}
				for _, n := range []int64{0, -1, inventory.MaxInitialStock + 1} {
					if _, err := svc.Restock(ctx, "r", n); !errors.Is(err, inventory.ErrInvalid) {
						t.Errorf("restock of %d: %v", n, err)
					}
				}
				a := quietAudit(t, svc, "r")
				if !a.Consistent() || a.Initial != 1 || a.Restocked != 4 || a.Available != 4 || a.Held != 1 {
					t.Errorf("audit %+v: want initial 1 + restocked 4 = available 4 + held 1", a)
				}
				// The restocked units sell, and no more.
				for i := range 4 {
					if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "r", Quantity: 1, UserID: fmt.Sprintf("after-%d", i)}); err != nil {
						t.Fatalf("order %d of the restocked units: %v", i+1, err)
					}
				}
				if _, err := svc.PlaceOrder(ctx, inventory.Request{SKU: "r", Quantity: 1, UserID: "one-too-many"}); !errors.Is(err, inventory.ErrSoldOut) {
					t.Errorf("an order past the restocked units: %v", err)
				}
				// A new sale starts from its own stock: nothing restocked.
				if err := svc.StartSale(ctx, "r", 2); err != nil {
					t.Fatal(err)
				}
				if a := quietAudit(t, svc, "r"); a.Restocked != 0 || a.Available != 2 || a.Orders != 0 {
					t.Errorf("audit of the next sale %+v", a)
				}
			})
		}
	}
}

// TestSaleWindows: on every safe strategy and both engines, an order
// before the window opens is refused not started, after it ends ended,
// each with nothing changed, and one inside it is taken. The reservation
// strategies check the window in Redis, on Redis's clock.
func TestSaleWindows(t *testing.T) {
	hour := time.Hour
	now := time.Now()
	windows := []struct {
		name string
		w    inventory.SaleWindow
		want error
	}{
		{"before", inventory.SaleWindow{StartsAt: now.Add(hour)}, inventory.ErrSaleNotStarted},
		{"after", inventory.SaleWindow{EndsAt: now.Add(-hour)}, inventory.ErrSaleEnded},
		{"after, both bounds", inventory.SaleWindow{StartsAt: now.Add(-2 * hour), EndsAt: now.Add(-hour)}, inventory.ErrSaleEnded},
		{"inside", inventory.SaleWindow{StartsAt: now.Add(-hour), EndsAt: now.Add(hour)}, nil},
	}
	for _, engine := range store.Engines {
		for name, build := range builders() {
			if strategies.IsControl(name) {
				continue
			}
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 8)
				svc := sales.NewService(db, build(t, engine, db), sales.WithOrderTimeout(30*time.Second))
				ctx := context.Background()
				for i, c := range windows {
					sku := fmt.Sprintf("w-%d", i)
					if err := svc.StartSaleWindow(ctx, sku, 2, c.w); err != nil {
						t.Fatalf("%s: start: %v", c.name, err)
					}
					_, err := svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "u"})
					if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
						t.Errorf("%s: order answered %v, want %v", c.name, err, c.want)
					}
					a, err := svc.Audit(ctx, sku)
					wantAvailable := int64(2)
					if c.want == nil {
						wantAvailable = 1
					}
					if err != nil || !a.Consistent() || a.Available != wantAvailable {
						t.Errorf("%s: audit %+v, %v: want %d available", c.name, a, err, wantAvailable)
					}
				}
				if err := svc.StartSaleWindow(ctx, "w-bad", 2, inventory.SaleWindow{StartsAt: now, EndsAt: now.Add(-time.Second)}); !errors.Is(err, inventory.ErrInvalid) {
					t.Errorf("a window that ends before it starts: %v", err)
				}
				if _, err := svc.Level(ctx, "w-bad"); !errors.Is(err, inventory.ErrUnknownSKU) {
					t.Errorf("the refused window started a sale: %v", err)
				}
			})
		}
	}
}
