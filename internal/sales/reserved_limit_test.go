package sales_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashsale/stock/internal/inventory"
	"github.com/flashsale/stock/internal/reservation"
	"github.com/flashsale/stock/internal/sales"
	"github.com/flashsale/stock/internal/store"
	"github.com/flashsale/stock/internal/strategies"
	"github.com/flashsale/stock/lab/testdb"
	"github.com/flashsale/stock/lab/testredis"
)

// reservedInstances returns n services of one reservation strategy on one
// durable Redis and db, each with its own client, store and consumer (n
// instances of the service), taking orders with PER_USER_LIMIT=limit.
func reservedInstances(t *testing.T, srv *testredis.Server, db store.Store, name string, n int, limit int64) []*sales.Service {
	t.Helper()
	var services []*sales.Service
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		var opts []reservation.Option
		var strategyOpts []reservation.ReservedOption
		if name == strategies.NameRedisWatch {
			opts = append(opts, reservation.WithOptimisticTransactions(50, 2))
			strategyOpts = append(strategyOpts, reservation.WithReservedName(strategies.NameRedisWatch))
		}
		res := reservation.New(rdb, db, opts...)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = res.NewConsumer(db).Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		services = append(services, sales.NewService(db, reservation.NewReserved(res, db, strategyOpts...),
			sales.WithOrderTimeout(30*time.Second), sales.WithPerUserLimit(limit)))
	}
	return services
}

// TestPerUserLimitInRedis: the reservation strategies count each buyer's
// units in Redis, in the same atomic step as the stock (the reserve
// script; WATCH on the buyers' counts for redis-watch). With
// PER_USER_LIMIT=1, 20 buyers each send two orders at once, one to each of
// two instances: each gets exactly one, the other 409 limit_reached with
// nothing taken, and the database receives one order per buyer. The count
// survives a restart of Redis from its append-only file, a retry of the
// same idempotency key is answered with its order, not refused, and a new
// sale forgets the counts.
func TestPerUserLimitInRedis(t *testing.T) {
	const buyers = 20
	for _, engine := range store.Engines {
		for _, name := range strategies.ReservedNames {
			t.Run(engine+"/"+name, func(t *testing.T) {
				t.Parallel()
				db := testdb.New(t, engine, 16)
				srv := testredis.StartDurable(t)
				instances := reservedInstances(t, srv, db, name, 2, 1)
				ctx := context.Background()
				sku := "limit-" + name
				if err := instances[0].StartSale(ctx, sku, 100); err != nil {
					t.Fatal(err)
				}
				errs := make([][2]error, buyers)
				var wg sync.WaitGroup
				for b := range buyers {
					for i, svc := range instances {
						wg.Go(func() {
							_, errs[b][i] = svc.PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: fmt.Sprintf("buyer-%d", b)})
						})
					}
				}
				wg.Wait()
				for b, pair := range errs {
					ok, limited := 0, 0
					for _, err := range pair {
						switch {
						case err == nil:
							ok++
						case errors.Is(err, inventory.ErrLimitReached):
							limited++
						default:
							t.Errorf("buyer %d: %v", b, err)
						}
					}
					if ok != 1 || limited != 1 {
						t.Errorf("buyer %d: %d orders taken and %d refused for the limit, want 1 and 1", b, ok, limited)
					}
				}
				// An order above the limit is refused outright, and
				// takes nothing.
				if _, err := instances[1].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 2, UserID: "greedy"}); !errors.Is(err, inventory.ErrLimitReached) {
					t.Errorf("2 units under a limit of 1: %v, want limit_reached", err)
				}
				// A retry of a taken order's key finds that order.
				keyed := inventory.Request{SKU: sku, Quantity: 1, UserID: "keyed", IdempotencyKey: "k-1"}
				first, err := instances[0].PlaceOrder(ctx, keyed)
				if err != nil {
					t.Fatal(err)
				}
				if again, err := instances[1].PlaceOrder(ctx, keyed); err != nil || again.ID != first.ID {
					t.Errorf("the key's retry: %v, %v; want order %s", again.ID, err, first.ID)
				}

				// Redis restarts from its append-only file: the counts
				// come back with the stock (the sale is checked against
				// the database on its first order).
				srv.Stop()
				srv.Restart(t)
				if _, err := placeWithin(ctx, instances[1], inventory.Request{SKU: sku, Quantity: 1, UserID: "buyer-0"}); !errors.Is(err, inventory.ErrLimitReached) {
					t.Errorf("buyer-0 after the restart: %v, want limit_reached", err)
				}
				if _, err := placeWithin(ctx, instances[0], inventory.Request{SKU: sku, Quantity: 1, UserID: "newcomer"}); err != nil {
					t.Errorf("a new buyer after the restart: %v", err)
				}

				// Every order reaches the database: one per buyer.
				a := quietAudit(t, instances[0], sku)
				if want := int64(buyers + 2); a.Written.Orders != want || a.Written.Ordered != want || a.Available != 100-want || !a.Consistent() {
					t.Errorf("audit %+v (written %+v), want %d orders of one unit", a, *a.Written, want)
				}

				// A new sale forgets who bought in the last one.
				if err := instances[0].StartSale(ctx, sku, 5); err != nil {
					t.Fatal(err)
				}
				if _, err := instances[1].PlaceOrder(ctx, inventory.Request{SKU: sku, Quantity: 1, UserID: "buyer-0"}); err != nil {
					t.Errorf("buyer-0 in a new sale: %v", err)
				}
			})
		}
	}
}

// placeWithin places req, again while the answer is 503 for at most 10 s:
// the client's first commands after a restart of Redis may find the old
// connections broken.
func placeWithin(ctx context.Context, svc *sales.Service, req inventory.Request) (inventory.Order, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, err := svc.PlaceOrder(ctx, req)
		if !errors.Is(err, inventory.ErrUnavailable) || time.Now().After(deadline) {
			return o, err
		}
		time.Sleep(20 * time.Millisecond) // polling a server that is starting
	}
}
